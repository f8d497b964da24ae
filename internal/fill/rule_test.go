package fill

import (
	"context"
	"errors"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/sylva-projects/osimages/internal/pull"
)

// run starts a fill under rule that reports what tell gives it and ends
// with its context; it returns the fill's end. tell returns once the rule
// has seen the report, so that the fake clock never passes a report the
// rule has not seen yet.
func run(rule Rule) (tell func(int64), done <-chan error) {
	report, seen := make(chan int64), make(chan struct{})
	end := make(chan error, 1)
	go func() {
		_, err := rule.Run(context.Background(), func(ctx context.Context, progress pull.Progress) (pull.Result, error) {
			for {
				select {
				case n := <-report:
					progress(n, 0)
					seen <- struct{}{}
				case <-ctx.Done():
					return pull.Result{}, ctx.Err()
				}
			}
		}, func(int64, int64) {})
		end <- err
	}()
	return func(n int64) {
		select {
		case report <- n:
			<-seen
		case err := <-end:
			end <- err
		}
	}, end
}

// step advances clk by d, a tick at a time, once the rule's ticker waits,
// and reports whether the fill ended meanwhile.
func step(t *testing.T, clk *clocktesting.FakeClock, d, tick time.Duration, done <-chan error) (error, bool) {
	t.Helper()
	for end := clk.Now().Add(d); clk.Now().Before(end); {
		for !clk.HasWaiters() {
			select {
			case err := <-done:
				return err, true
			case <-time.After(time.Millisecond):
			}
		}
		clk.Step(tick)
		// The watch takes the tick; the fill's end, if it comes, follows.
		select {
		case err := <-done:
			return err, true
		case <-time.After(2 * time.Millisecond):
		}
	}
	return nil, false
}

func wait(t *testing.T, done <-chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(time.Minute):
		t.Fatal("the fill did not end")
		return nil
	}
}

func TestRuleCutsAStall(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(0, 0))
	tell, done := run(Rule{Stall: 10 * time.Second, Clock: clk})
	tell(100)
	if err, ended := step(t, clk, 9*time.Second, time.Second, done); ended {
		t.Fatalf("cut before the stall timeout: %v", err)
	}
	tell(100) // a sign of life: the count starts again
	if err, ended := step(t, clk, 9*time.Second, time.Second, done); ended {
		t.Fatalf("cut though it showed life: %v", err)
	}
	err, ended := step(t, clk, 5*time.Second, time.Second, done)
	if !ended {
		err = wait(t, done)
	}
	var stall *StallError
	if !errors.As(err, &stall) || stall.Timeout != 10*time.Second || !errors.Is(err, context.Canceled) {
		t.Fatalf("want a StallError wrapping the fill's own error, got %v", err)
	}
}

func TestRuleCutsASlowFill(t *testing.T) {
	for _, tc := range []struct {
		name      string
		contended bool
		nilFunc   bool
		cut       bool
	}{
		{"always (a peer's fill)", false, true, true},
		{"when another image waits", true, false, true},
		{"not when none waits", false, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := clocktesting.NewFakeClock(time.Unix(0, 0))
			rule := Rule{Stall: 10 * time.Second, MinRate: 100, Clock: clk}
			if !tc.nilFunc {
				rule.Contended = func() bool { return tc.contended }
			}
			tell, done := run(rule)
			// 50 bytes a second, half the minimum, for 30 s: a trickle.
			var ended bool
			var err error
			for i := int64(1); i <= 30 && !ended; i++ {
				tell(50 * i)
				err, ended = step(t, clk, time.Second, time.Second, done)
				if ended && i < 10 {
					t.Fatalf("cut after %d s, before a whole window: %v", i, err)
				}
			}
			if !tc.cut {
				if ended {
					t.Fatalf("cut though nothing waits: %v", err)
				}
				return
			}
			if !ended {
				t.Fatal("a trickle was never cut")
			}
			var slow *SlowError
			if !errors.As(err, &slow) || slow.MinRate != 100 {
				t.Fatalf("want a SlowError, got %v", err)
			}
		})
	}
}

// Reading back the bytes kept by an earlier attempt sends no network byte:
// it is a sign of life, not a slow fill; the rate counts from the first
// network byte.
func TestRuleMeasuresFromTheFirstNetworkByte(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(0, 0))
	tell, done := run(Rule{Stall: 10 * time.Second, MinRate: 100, Clock: clk})
	// 25 s of checking kept bytes, with signs of life at the kept offset.
	for range 25 {
		tell(5000)
		if err, ended := step(t, clk, time.Second, time.Second, done); ended {
			t.Fatalf("cut while the kept bytes were checked: %v", err)
		}
	}
	// Then 200 bytes a second: above the minimum.
	for i := int64(1); i <= 20; i++ {
		tell(5000 + 200*i)
		if err, ended := step(t, clk, time.Second, time.Second, done); ended {
			t.Fatalf("cut at a good rate: %v", err)
		}
	}
}
