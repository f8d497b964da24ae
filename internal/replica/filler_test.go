package replica

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sylva-projects/osimages/internal/fill"
	"github.com/sylva-projects/osimages/internal/imagestore"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/pull"
	"github.com/sylva-projects/osimages/internal/servedset"
)

// A peer that failed an image is skipped for that image, without being
// asked again, until Forget (the image is stored, or gone).
func TestFillerSkipsAPeerThatFailedUntilForget(t *testing.T) {
	img := newImage(t, 1<<20, 9)
	liar := newHolder(t, img)
	liar.storeVerified(t)
	liar.lie = bytes.Clone(img.data)
	liar.lie[1<<19] ^= 0xff
	p, _ := serve(t, "liar", liar, time.Second)
	v := NewView(&replicas{self: "self", selfReady: true, ready: []Peer{p}}, nil, nil, ClaimRule{})
	v.readAll(context.Background())

	var sources, failed []string
	f := &Filler{
		View: v, Puller: NewPuller(10 * time.Second), Wait: time.Second,
		Registry: fill.Func{Label: fill.FromRegistry, F: func(_ context.Context, _ servedset.Wanted, dst *imagestore.Writer, progress pull.Progress) (pull.Result, error) {
			n, err := dst.Write(img.data)
			progress(int64(n), int64(n))
			return pull.Result{Size: int64(n), MD5: img.w.Image.Get(osimage.FieldMD5), SHA256: string(img.w.SHA256)}, err
		}},
		RegistryRule: func(osimage.SHA256) fill.Rule { return fill.Rule{} },
		Started:      func(_ osimage.SHA256, source string) { sources = append(sources, source) },
		PeerFailed: func(_ servedset.Wanted, peer string, err error) {
			if !errors.As(err, new(*pull.VerifyError)) {
				t.Errorf("the liar failed with %v; want a verification error", err)
			}
			failed = append(failed, peer)
		},
	}
	store := openStore(t)
	fillOnce := func() string {
		t.Helper()
		dst, err := store.Resume(img.w.SHA256)
		if err != nil {
			t.Fatal(err)
		}
		defer dst.Abort()
		_, from, err := f.Fill(context.Background(), img.w, dst, func(int64, int64) {})
		if err != nil {
			t.Fatalf("fill: %v", err)
		}
		return from
	}
	if from := fillOnce(); from != fill.FromRegistry || len(failed) != 1 || failed[0] != "liar" {
		t.Fatalf("first fill from %q, failed %v; want the registry after the liar", from, failed)
	}
	sources = nil
	if from := fillOnce(); from != fill.FromRegistry || len(failed) != 1 || len(sources) != 1 {
		t.Fatalf("second fill from %q, sources %v, failed %v; want the registry at once, the liar skipped", from, sources, failed)
	}
	f.Forget(img.w.SHA256)
	if fillOnce(); len(failed) != 2 {
		t.Fatalf("after Forget, failed %v; want the liar asked again", failed)
	}
}
