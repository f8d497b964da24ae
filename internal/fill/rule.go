package fill

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"k8s.io/utils/clock"

	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/pull"
)

// Rule is the one rule that cuts a fill, whatever its source:
//
//   - it stalled: no sign of life for Stall, counted from the start (the
//     manifest and the signature count), ends it with a *StallError;
//   - it is slow: fewer than MinRate bytes per second over the last Stall
//     window, counted from its first network byte (after the bytes kept by
//     an earlier attempt were read back and checked), ends it with a
//     *SlowError, when Contended says that another image waits for its
//     slot, or always when Contended is nil.
//
// The server gives the registry's fills its --stall-timeout and --min-rate
// while others wait; a peer's fills --peer-timeout and --min-rate always,
// for the registry is there to take over.
type Rule struct {
	Stall   time.Duration
	MinRate int64
	// RateWindow is the window of the rate, Stall when 0.
	RateWindow time.Duration
	Contended  func() bool
	// StallName and MinRateName name the settings in the errors, for the
	// operator to know what to change ("--stall-timeout", "--min-rate").
	StallName, MinRateName string
	// Clock measures; nil is the real clock.
	Clock clock.WithTicker
}

// StallError ends a fill that showed no sign of life for Timeout.
type StallError struct {
	Timeout time.Duration
	Setting string
}

func (e *StallError) Error() string {
	return fmt.Sprintf("stalled: no byte received for %s%s", e.Timeout, named(e.Setting))
}

// SlowError ends a fill slower than the minimum rate.
type SlowError struct {
	Received int64
	Window   time.Duration
	MinRate  int64
	Setting  string
}

func (e *SlowError) Error() string {
	setting := e.Setting
	if setting == "" {
		setting = "the minimum rate"
	}
	return fmt.Sprintf("%s in the last %s, below %s %s/s", osimage.FormatBytes(e.Received), e.Window.Round(time.Millisecond), setting, osimage.FormatBytes(e.MinRate))
}

func named(setting string) string {
	if setting == "" {
		return ""
	}
	return " (" + setting + ")"
}

// Run runs fill under the rule, passing progress on. An error of a fill
// the rule cut wraps both the rule's error (*StallError or *SlowError,
// errors.As) and what the fill returned.
func (r Rule) Run(ctx context.Context, fill func(context.Context, pull.Progress) (pull.Result, error), progress pull.Progress) (pull.Result, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	report, stop := r.Watch(ctx, cancel)
	res, err := fill(ctx, func(received, total int64) {
		report(received)
		progress(received, total)
	})
	stop()
	var stall *StallError
	var slow *SlowError
	if cause := context.Cause(ctx); err != nil && (errors.As(cause, &stall) || errors.As(cause, &slow)) {
		err = fmt.Errorf("%w; the attempt ended with: %w", cause, err)
	}
	return res, err
}

// Watch applies the rule to a transfer that is not a fill (a relay of a
// peer's copy to a client): report each count of bytes received so far;
// the rule ends ctx through cancel with its *StallError or *SlowError;
// stop ends the watch, and returns once it has.
func (r Rule) Watch(ctx context.Context, cancel context.CancelCauseFunc) (report func(received int64), stop func()) {
	clk := r.Clock
	if clk == nil {
		clk = clock.RealClock{}
	}
	w := &watch{rule: r, clock: clk, alive: clk.Now(), first: -1}
	return w.report, w.start(ctx, cancel)
}

// watch measures one fill.
type watch struct {
	rule  Rule
	clock clock.WithTicker

	mu sync.Mutex
	// alive is the last sign of life; first the first offset reported
	// (-1 before any), received the last; growing is set once received
	// moved from first: the network sends.
	alive           time.Time
	first, received int64
	growing         bool
}

func (w *watch) report(received int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.alive = w.clock.Now()
	if w.first < 0 {
		w.first = received
	}
	if received != w.first {
		w.growing = true
	}
	w.received = received
}

// sample is the bytes received at a time.
type sample struct {
	at       time.Time
	received int64
}

// start watches until stop is called, and cancels ctx with the rule's
// error when it applies.
func (w *watch) start(ctx context.Context, cancel context.CancelCauseFunc) (stop func()) {
	stall, window := w.rule.Stall, w.rule.RateWindow
	if window <= 0 {
		window = stall
	}
	tick := w.clock.NewTicker(min(max(min(stall, window)/10, 10*time.Millisecond), time.Second))
	done, exited := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(exited)
		defer tick.Stop()
		var samples []sample
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-tick.C():
			}
			now := w.clock.Now()
			w.mu.Lock()
			alive, received, growing := w.alive, w.received, w.growing
			w.mu.Unlock()
			if stall > 0 && now.Sub(alive) >= stall {
				cancel(&StallError{Timeout: stall, Setting: w.rule.StallName})
				return
			}
			if !growing || w.rule.MinRate <= 0 || window <= 0 {
				// No network byte yet: the rate counts from the first.
				samples = samples[:0]
				continue
			}
			if len(samples) == 0 {
				samples = append(samples, sample{now, received})
				continue
			}
			samples = append(samples, sample{now, received})
			// One sample at least a window old stays: the rate is measured
			// over a whole window, never over a shorter start.
			for len(samples) > 1 && now.Sub(samples[1].at) >= window {
				samples = samples[1:]
			}
			base := samples[0]
			elapsed := now.Sub(base.at)
			if elapsed >= window && float64(received-base.received) < float64(w.rule.MinRate)*elapsed.Seconds() &&
				(w.rule.Contended == nil || w.rule.Contended()) {
				cancel(&SlowError{Received: received - base.received, Window: elapsed, MinRate: w.rule.MinRate, Setting: w.rule.MinRateName})
				return
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			close(done)
			<-exited
		})
	}
}
