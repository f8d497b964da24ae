package fill

import (
	"context"
	"errors"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/sylva-projects/osimages/internal/pull"
)

func TestRuleErrors(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{&StallError{Timeout: 30 * time.Second, Setting: "--stall-timeout"}, "stalled: no byte received for 30s (--stall-timeout)"},
		{&StallError{Timeout: time.Minute}, "stalled: no byte received for 1m0s"},
		{&SlowError{Received: 1 << 20, Window: 30*time.Second + 1234*time.Microsecond, MinRate: 1 << 20, Setting: "--min-rate"},
			"1.0 MiB in the last 30.001s, below --min-rate 1.0 MiB/s"},
		{&SlowError{Received: 0, Window: 10 * time.Second, MinRate: 512}, "0 B in the last 10s, below the minimum rate 512 B/s"},
	} {
		if got := tc.err.Error(); got != tc.want {
			t.Errorf("%#v: %q, want %q", tc.err, got, tc.want)
		}
	}
}

// TestRuleLetsAFillEnd: a fill that ends by itself keeps its result and
// error, untouched by the rule, and the rule's watch ends with it.
func TestRuleLetsAFillEnd(t *testing.T) {
	own := errors.New("the registry says 404")
	for _, want := range []error{nil, own} {
		res, err := Rule{Stall: time.Hour, MinRate: 1}.Run(context.Background(), func(_ context.Context, progress pull.Progress) (pull.Result, error) {
			progress(10, 10)
			return pull.Result{Size: 10}, want
		}, func(int64, int64) {})
		if err != want || res.Size != 10 {
			t.Errorf("%+v %v, want %v", res, err, want)
		}
	}
}

// TestRuleWithoutLimits: a rule with neither a stall timeout nor a
// minimum rate never cuts, however long the fill is silent.
func TestRuleWithoutLimits(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(0, 0))
	tell, done := run(Rule{Clock: clk})
	tell(1)
	if err, ended := step(t, clk, time.Hour, time.Minute, done); ended {
		t.Fatalf("cut: %v", err)
	}
}
