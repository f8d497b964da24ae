package replica

import (
	"bytes"
	"context"
	"errors"
	"net/http/httptest"
	"slices"
	"sync"
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
			return pull.Result{Size: int64(n), MD5: img.w.Desc.MD5, SHA256: string(img.w.SHA256)}, err
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

// TestFillerFollowsAPeerStartedAgainAfterItFailed: the peer this replica
// follows stops (a StatefulSet's rolling update replaces each pod, under
// the same name) and runs again as another instance, which pulls the image
// from the registry: this replica follows it, in the same fill. The
// instance that failed stays skipped. Before, the peer stayed skipped by
// its ID until the image was stored: this replica chose the registry and
// left that peer out of its claim's check, and both pulled the image from
// the registry (1.60× the layer in cmd/osimages'
// TestServeReplicasRollingUpdateMidFill).
func TestFillerFollowsAPeerStartedAgainAfterItFailed(t *testing.T) {
	img := newImage(t, 2<<20, 12)
	ctx := context.Background()
	rs := &replicas{self: "self"}
	v := NewView(rs, nil, nil, ClaimRule{})
	var sources, failed []string
	f := &Filler{
		View: v, Puller: NewPuller(10 * time.Second), Wait: time.Second,
		Registry: fill.Func{Label: fill.FromRegistry, F: func(_ context.Context, _ servedset.Wanted, dst *imagestore.Writer, progress pull.Progress) (pull.Result, error) {
			if err := dst.Reset(); err != nil {
				return pull.Result{}, err
			}
			n, err := dst.Write(img.data)
			progress(int64(n), int64(n))
			return pull.Result{Size: int64(n), MD5: img.w.Desc.MD5, SHA256: string(img.w.SHA256)}, err
		}},
		RegistryRule: func(osimage.SHA256) fill.Rule { return fill.Rule{} },
		PeerRule:     fill.Rule{Stall: 10 * time.Second},
		Started:      func(_ osimage.SHA256, source string) { sources = append(sources, source) },
		PeerFailed:   func(_ servedset.Wanted, peer string, _ error) { failed = append(failed, peer) },
	}
	store := openStore(t)
	fillOnce := func(progress pull.Progress) string {
		t.Helper()
		sources = nil
		dst, err := store.Resume(img.w.SHA256)
		if err != nil {
			t.Fatal(err)
		}
		defer dst.Abort()
		_, from, err := f.Fill(ctx, img.w, dst, progress)
		if err != nil {
			t.Fatalf("fill: %v", err)
		}
		return from
	}
	// run serves h as the peer "origin", the one listed, and reads it.
	run := func(h *holder) *httptest.Server {
		p, srv := serve(t, "origin", h, 10*time.Second)
		rs.mu.Lock()
		rs.ready = []Peer{p}
		rs.mu.Unlock()
		v.readAll(ctx)
		return srv
	}

	// Instance 1 pulls the image from the registry; this replica follows
	// it. Half way, instance 1 stops and instance 2 pulls.
	first := newHolder(t, img)
	first.instance = "1"
	first.startDownload(t)(1 << 20)
	firstSrv := run(first)
	var once sync.Once
	from := fillOnce(func(received, _ int64) {
		if received < 512<<10 {
			return
		}
		once.Do(func() {
			second := newHolder(t, img)
			second.instance = "2"
			second.startDownload(t)(len(img.data))
			firstSrv.CloseClientConnections()
			firstSrv.Close()
			run(second)
		})
	})
	if from != "peer origin" || !slices.Equal(sources, []string{"peer origin", "peer origin"}) || !slices.Equal(failed, []string{"origin"}) {
		t.Fatalf("filled from %q through %v, failed %v; want the peer's instance 2 after its instance 1 failed, not a second registry pull", from, sources, failed)
	}
	// Instance 1 answers again (a network blip, say): still skipped.
	run(first)
	if from := fillOnce(func(int64, int64) {}); from != fill.FromRegistry || !slices.Equal(sources, []string{fill.FromRegistry}) {
		t.Fatalf("filled from %q through %v; want the registry at once, the instance that failed skipped", from, sources)
	}
}
