package scrub

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sylva-projects/osimages/internal/imagestore"
	"github.com/sylva-projects/osimages/internal/osimage"
)

// The picking and the outcomes are pure logic over the two interfaces:
// fakes of both. The server's tests scrub a real store.

type fakeImages struct {
	mu       sync.Mutex
	stored   []Stored
	scrubbed map[osimage.SHA256]imagestore.Entry
	tampered map[osimage.SHA256]string
}

func (f *fakeImages) Stored() []Stored {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]Stored(nil), f.stored...)
}

func (f *fakeImages) Scrubbed(sum osimage.SHA256, e imagestore.Entry) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.scrubbed[sum] = e
	for i := range f.stored {
		if f.stored[i].SHA256 == sum {
			f.stored[i].Entry = e
		}
	}
}

func (f *fakeImages) Tampered(sum osimage.SHA256, reason string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.tampered[sum] = reason
}

type storeFunc func(sum osimage.SHA256) (imagestore.Entry, error)

func (f storeFunc) Scrub(_ context.Context, sum osimage.SHA256, throttle func(context.Context, int) error, _ func() time.Time) (imagestore.Entry, error) {
	if err := throttle(context.Background(), 1); err != nil {
		return imagestore.Entry{}, err
	}
	return f(sum)
}

func sha(c byte) osimage.SHA256 {
	b := make([]byte, 64)
	for i := range b {
		b[i] = c
	}
	return osimage.SHA256(b)
}

func TestTheImageCheckedLongestAgoIsScrubbedFirst(t *testing.T) {
	now := time.Date(2026, 1, 10, 0, 0, 0, 0, time.UTC)
	old, recent, future := sha('a'), sha('b'), sha('c')
	images := &fakeImages{scrubbed: map[osimage.SHA256]imagestore.Entry{}, tampered: map[osimage.SHA256]string{}, stored: []Stored{
		{SHA256: recent, Key: "recent", Entry: imagestore.Entry{SHA256: recent, VerifiedAt: now.Add(-2 * time.Hour)}},
		{SHA256: old, Key: "old", Entry: imagestore.Entry{SHA256: old, VerifiedAt: now.Add(-3 * time.Hour)}},
		{SHA256: future, Key: "future", Entry: imagestore.Entry{SHA256: future, VerifiedAt: now.Add(1000 * time.Hour)}},
	}}
	s := New(Config{Images: images, Interval: time.Hour, Rate: 1 << 30, Now: func() time.Time { return now }})
	// A check dated in the future is due now, not in a thousand hours:
	// after the two overdue ones, by their due dates.
	var order []string
	for range 3 {
		img, wait := s.next()
		if img.SHA256 == "" {
			t.Fatalf("nothing due after %v; want three due", order)
		}
		if wait != 0 || s.Status().Current != img.SHA256 {
			t.Fatalf("next = %s, %v; status current %s", img.Key, wait, s.Status().Current)
		}
		order = append(order, img.Key)
		images.Scrubbed(img.SHA256, imagestore.Entry{SHA256: img.SHA256, ScrubbedAt: now})
	}
	if fmt.Sprint(order) != "[old recent future]" {
		t.Errorf("order %v; want [old recent future]", order)
	}
	if img, wait := s.next(); img.SHA256 != "" || wait != time.Hour {
		t.Errorf("after the pass: %s, %v; want nothing due for an hour", img.Key, wait)
	}
	if s.Status().UpToDate != now {
		t.Errorf("upToDate %v; want %v", s.Status().UpToDate, now)
	}
}

func TestScrubOutcomes(t *testing.T) {
	now := time.Date(2026, 1, 10, 0, 0, 0, 0, time.UTC)
	changed, unreadable, fine := sha('a'), sha('b'), sha('c')
	images := &fakeImages{scrubbed: map[osimage.SHA256]imagestore.Entry{}, tampered: map[osimage.SHA256]string{}}
	store := storeFunc(func(sum osimage.SHA256) (imagestore.Entry, error) {
		switch sum {
		case changed:
			return imagestore.Entry{}, fmt.Errorf("it hashes to sha256 %s: %w", sha('f'), imagestore.ErrTampered)
		case unreadable:
			return imagestore.Entry{}, errors.New("input/output error")
		}
		return imagestore.Entry{SHA256: sum, ScrubbedAt: now}, nil
	})
	s := New(Config{Images: images, Store: store, Interval: 24 * time.Hour, Rate: 1 << 30, Now: func() time.Time { return now }})
	for _, sum := range []osimage.SHA256{changed, unreadable, fine} {
		s.scrubOne(context.Background(), Stored{SHA256: sum, Key: string(sum[:1])}, func(context.Context, int) error { return nil })
	}
	if _, ok := images.tampered[changed]; !ok || len(images.tampered) != 1 {
		t.Errorf("tampered %v; want only %s", images.tampered, changed)
	}
	if st := s.Status(); len(st.Failures) != 1 || st.Failures[0].SHA256 != changed || st.Failures[0].Key != "a" {
		t.Errorf("failures %+v; want the changed image", st.Failures)
	}
	if _, ok := images.scrubbed[fine]; !ok || len(images.scrubbed) != 1 {
		t.Errorf("scrubbed %v; want only %s", images.scrubbed, fine)
	}
	// An I/O error keeps the image, and tries it again later, not at once.
	if at := s.retryAt[unreadable]; !at.Equal(now.Add(time.Hour)) {
		t.Errorf("unreadable retried at %v; want an hour later", at)
	}
	images.stored = []Stored{{SHA256: unreadable, Entry: imagestore.Entry{VerifiedAt: now.Add(-48 * time.Hour)}}}
	if img, wait := s.next(); img.SHA256 != "" || wait != time.Hour {
		t.Errorf("next after an I/O error: %s, %v; want nothing for an hour", img.SHA256, wait)
	}
	// The failures listed are bounded: the newest stay.
	for range maxFailures + 3 {
		s.scrubOne(context.Background(), Stored{SHA256: changed}, func(context.Context, int) error { return nil })
	}
	if n := len(s.Status().Failures); n != maxFailures {
		t.Errorf("%d failures listed; want %d", n, maxFailures)
	}
}

func TestRunCountsTheBytesReadAndStops(t *testing.T) {
	sum := sha('a')
	images := &fakeImages{scrubbed: map[osimage.SHA256]imagestore.Entry{}, tampered: map[osimage.SHA256]string{},
		stored: []Stored{{SHA256: sum, Entry: imagestore.Entry{SHA256: sum}}}}
	ctx, cancel := context.WithCancel(context.Background())
	store := storeFunc(func(sum osimage.SHA256) (imagestore.Entry, error) {
		defer cancel()
		return imagestore.Entry{SHA256: sum, ScrubbedAt: time.Now()}, nil
	})
	s := New(Config{Images: images, Store: store, Interval: time.Hour, Rate: 1 << 30})
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	<-done
	if st := s.Status(); st.Bytes != 1 || !st.Enabled {
		t.Errorf("status %+v; want 1 byte read, enabled", st)
	}
	// Off: Run returns at once.
	New(Config{Images: images, Store: store}).Run(context.Background())
}
