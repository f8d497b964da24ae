package server

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sylva-projects/osimages/internal/imagehttp"
	"github.com/sylva-projects/osimages/internal/imagestore"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/servedset"
	"github.com/sylva-projects/osimages/internal/serverio"
)

// An image deselected after a worker claimed it, but before its download
// began, is not downloaded: there was no download to cancel when it was
// deselected. The download of the fake source below never ends on its own,
// so without the check the worker would hang (and, with a real source,
// download an image nobody wants). make test caught it about once in 20
// runs of TestDeselectCancelsDownload on a loaded machine.
func TestDeselectedBetweenClaimAndDownload(t *testing.T) {
	store, err := imagestore.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	src := newFakeSource()
	a := src.add("ubuntu-a", []byte("a bytes, long enough"), true)
	srv := New(Config{Store: store, Pull: src.pull, Publisher: serverio.FilePublisher{Path: t.TempDir() + "/served.yaml"},
		Concurrency: 1, GCGrace: time.Hour, FreeSpaceMargin: 1, Metrics: imagehttp.NewMetrics()})

	srv.SetDesired(map[osimage.SHA256]servedset.Wanted{a.SHA256: a}, nil)
	sum, ok := srv.next()
	if !ok || sum != a.SHA256 {
		t.Fatalf("next claimed %q, %v", sum, ok)
	}
	srv.SetDesired(map[osimage.SHA256]servedset.Wanted{}, nil)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() { srv.download(ctx, sum); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		cancel()
		<-done
		t.Fatal("the download of a deselected image went on")
	}
	if st, _ := srv.Statuses(); len(st) != 0 {
		t.Errorf("the deselected image is still known: %s", fmt.Sprint(st))
	}
	if len(store.List()) != 0 {
		t.Error("the deselected image was stored")
	}
}
