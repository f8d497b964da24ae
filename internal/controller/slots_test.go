package controller

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sylva-projects/osimages/internal/testenv"
)

// waitFor polls cond every few milliseconds: the slots move as fast as
// goroutines are scheduled.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testenv.Poll(t, what, 10*time.Second, 5*time.Millisecond, func() (bool, string) { return cond(), "" })
}

// stuck is a request to a registry that never answers: it ends only when
// its context does, and reports why.
func stuck(causes chan<- error) func(context.Context) error {
	return func(ctx context.Context) error {
		<-ctx.Done()
		causes <- context.Cause(ctx)
		return ctx.Err()
	}
}

func TestFairSlotsNewcomerPreemptsTheHog(t *testing.T) {
	var preempted sync.Map
	f := newFairSlots(4, func(ns string) {
		n, _ := preempted.LoadOrStore(ns, new(atomic.Int64))
		n.(*atomic.Int64).Add(1)
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	causes := make(chan error, 100)
	var wg sync.WaitGroup
	// "hog" holds all four slots, and wants more.
	for range 6 {
		wg.Add(1)
		go func() { defer wg.Done(); _ = f.do(ctx, "hog", stuck(causes)) }()
	}
	waitFor(t, "the hog holds every slot", func() bool { f.mu.Lock(); defer f.mu.Unlock(); return len(f.held["hog"]) == 4 })

	// A newcomer gets a slot at once, taken from the hog.
	done := make(chan error, 1)
	go func() { done <- f.do(ctx, "newcomer", func(context.Context) error { return nil }) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the newcomer waited for a slot the hog holds for ever")
	}
	if err := <-causes; !errors.Is(err, errPreempted) {
		t.Errorf("the hog's request ended with %v, want a preemption", err)
	}
	if n, ok := preempted.Load("hog"); !ok || n.(*atomic.Int64).Load() != 1 {
		t.Errorf("preemptions of the hog: %v", n)
	}
	// The preempted request is made again: the hog has its four slots back.
	waitFor(t, "the hog's request made again", func() bool { f.mu.Lock(); defer f.mu.Unlock(); return len(f.held["hog"]) == 4 })

	// Two namespaces at their share: nobody is preempted for a third
	// request of one of them.
	f2 := newFairSlots(4, nil)
	for _, ns := range []string{"a", "a", "b", "b"} {
		wg.Add(1)
		go func() { defer wg.Done(); _ = f2.do(ctx, ns, stuck(causes)) }()
	}
	waitFor(t, "a and b hold two each", func() bool { f2.mu.Lock(); defer f2.mu.Unlock(); return f2.inUse == 4 })
	wctx, wcancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer wcancel()
	if err := f2.do(wctx, "a", func(context.Context) error { return nil }); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a namespace at its share got a third slot: %v", err)
	}
	f2.mu.Lock()
	if len(f2.waiting) != 0 || f2.inUse != 4 {
		t.Errorf("a waiter that gave up is left behind: %d waiting, %d in use", len(f2.waiting), f2.inUse)
	}
	f2.mu.Unlock()
	select {
	case err := <-causes:
		t.Errorf("a request was cut: %v", err)
	default:
	}

	cancel()
	wg.Wait()
	if f.inUse != 0 || f2.inUse != 0 {
		t.Errorf("slots left in use: %d, %d", f.inUse, f2.inUse)
	}
}
