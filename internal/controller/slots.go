package controller

import (
	"context"
	"errors"
	"sync"

	"github.com/opencontainers/go-digest"

	"github.com/sylva-projects/osimages/internal/catalog"
	"github.com/sylva-projects/osimages/internal/oci"
	"github.com/sylva-projects/osimages/internal/signature"
)

// errPreempted cancels a registry request that gives its slot to a
// namespace below its share; the request is made again once a slot is
// free.
var errPreempted = errors.New("registry slot given to another namespace")

// fairSlots are the registry requests the catalogs of every namespace
// make at once. A free slot goes to the waiting namespace that holds the
// fewest. When none is free, a namespace below its share (the slots
// divided by the namespaces holding or waiting for one) takes the newest
// slot of the namespace furthest above it: a registry that accepts
// connections and never answers then holds at most its namespace's share,
// and a newcomer starts at once instead of after the stuck requests'
// deadlines.
type fairSlots struct {
	mu      sync.Mutex
	total   int
	held    map[string][]*slot
	inUse   int
	waiting []*slotWaiter
	// onPreempt counts preemptions, by the namespace that gave a slot.
	onPreempt func(namespace string)
}

type slot struct {
	namespace string
	cancel    context.CancelCauseFunc
	preempted bool
}

type slotWaiter struct {
	namespace string
	granted   chan *slot
	ctx       context.Context
	cancel    context.CancelCauseFunc
}

func newFairSlots(total int, onPreempt func(string)) *fairSlots {
	if onPreempt == nil {
		onPreempt = func(string) {}
	}
	return &fairSlots{total: total, held: map[string][]*slot{}, onPreempt: onPreempt}
}

// do runs fn with a slot of namespace, under a context that the slot's
// preemption cancels, and runs it again (with a new slot) when it was
// preempted while ctx still holds.
func (f *fairSlots) do(ctx context.Context, namespace string, fn func(context.Context) error) error {
	for {
		s, sctx, err := f.acquire(ctx, namespace)
		if err != nil {
			return err
		}
		err = fn(sctx)
		if preempted := f.release(s); preempted && ctx.Err() == nil {
			continue
		}
		return err
	}
}

func (f *fairSlots) acquire(ctx context.Context, namespace string) (*slot, context.Context, error) {
	sctx, cancel := context.WithCancelCause(ctx)
	w := &slotWaiter{namespace: namespace, granted: make(chan *slot, 1), ctx: sctx, cancel: cancel}
	f.mu.Lock()
	f.waiting = append(f.waiting, w)
	f.dispatch()
	if len(w.granted) == 0 {
		f.preemptFor(namespace)
	}
	f.mu.Unlock()
	select {
	case s := <-w.granted:
		return s, sctx, nil
	case <-ctx.Done():
		f.mu.Lock()
		f.removeWaiter(w)
		f.mu.Unlock()
		// Granted meanwhile: give it back.
		select {
		case s := <-w.granted:
			f.release(s)
		default:
		}
		cancel(nil)
		return nil, nil, context.Cause(ctx)
	}
}

// release frees s and says whether it had been preempted.
func (f *fairSlots) release(s *slot) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	held := f.held[s.namespace]
	for i, h := range held {
		if h == s {
			f.held[s.namespace] = append(held[:i:i], held[i+1:]...)
			f.inUse--
			break
		}
	}
	if len(f.held[s.namespace]) == 0 {
		delete(f.held, s.namespace)
	}
	s.cancel(nil)
	f.dispatch()
	return s.preempted
}

// dispatch grants free slots to the waiters of the namespaces that hold
// the fewest, first come first served among equals. Called locked.
func (f *fairSlots) dispatch() {
	for f.inUse < f.total && len(f.waiting) > 0 {
		best := -1
		for i, w := range f.waiting {
			if w.ctx.Err() != nil {
				continue
			}
			if best < 0 || len(f.held[w.namespace]) < len(f.held[f.waiting[best].namespace]) {
				best = i
			}
		}
		if best < 0 {
			return
		}
		w := f.waiting[best]
		f.waiting = append(f.waiting[:best:best], f.waiting[best+1:]...)
		s := &slot{namespace: w.namespace, cancel: w.cancel}
		f.held[w.namespace] = append(f.held[w.namespace], s)
		f.inUse++
		w.granted <- s
	}
}

// preemptFor takes a slot from the namespace furthest above its share for
// namespace, when namespace is below its own. Called locked.
func (f *fairSlots) preemptFor(namespace string) {
	active := map[string]bool{}
	for ns := range f.held {
		active[ns] = true
	}
	for _, w := range f.waiting {
		active[w.namespace] = true
	}
	share := max(f.total/len(active), 1)
	if f.keeping(namespace) >= share {
		return
	}
	victim, most := "", share
	for ns := range f.held {
		if n := f.keeping(ns); n > most {
			victim, most = ns, n
		}
	}
	if victim == "" {
		return
	}
	held := f.held[victim]
	for i := len(held) - 1; i >= 0; i-- {
		if s := held[i]; !s.preempted {
			s.preempted = true
			s.cancel(errPreempted)
			f.onPreempt(victim)
			return
		}
	}
}

// keeping counts the slots of namespace not already given away.
func (f *fairSlots) keeping(namespace string) int {
	n := 0
	for _, s := range f.held[namespace] {
		if !s.preempted {
			n++
		}
	}
	return n
}

func (f *fairSlots) removeWaiter(w *slotWaiter) {
	for i, x := range f.waiting {
		if x == w {
			f.waiting = append(f.waiting[:i:i], f.waiting[i+1:]...)
			return
		}
	}
}

// slotFetcher makes the manifest requests of one namespace's catalog
// within its share of the slots.
type slotFetcher struct {
	slots     *fairSlots
	namespace string
	inner     catalog.ManifestFetcher
}

func (f slotFetcher) FetchManifest(ctx context.Context, uri string) (oci.Manifest, error) {
	var m oci.Manifest
	err := f.slots.do(ctx, f.namespace, func(ctx context.Context) error {
		var err error
		m, err = f.inner.FetchManifest(ctx, uri)
		return err
	})
	return m, err
}

// slotVerifier is slotFetcher for the signature requests.
type slotVerifier struct {
	slots     *fairSlots
	namespace string
	inner     catalog.SignatureVerifier
}

func (v slotVerifier) Verify(ctx context.Context, uri string, d digest.Digest, key *signature.PublicKey) error {
	return v.slots.do(ctx, v.namespace, func(ctx context.Context) error {
		return v.inner.Verify(ctx, uri, d, key)
	})
}
