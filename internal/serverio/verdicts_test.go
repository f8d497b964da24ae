package serverio

import (
	"errors"
	"testing"
	"time"
)

func TestVerdictsKeepTheLastRefusalUntilInputsAreAccepted(t *testing.T) {
	var v Verdicts
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	if st := v.Status(); !st.Accepted.IsZero() || st.Refused != nil || len(st.Refusals) != len(Refusals) {
		t.Fatalf("zero value: %+v; want nothing accepted or refused, every reason at 0", st)
	}
	v.Record(nil, t0)
	v.Record(&RefusedError{Reason: RefusalEmpty, Err: errors.New("no image")}, t0.Add(time.Minute))
	v.Record(errors.New("cannot read"), t0.Add(2*time.Minute))
	st := v.Status()
	if !st.Accepted.Equal(t0) || st.Refused == nil || st.Refused.Reason != RefusalUnreadable || !st.RefusedAt.Equal(t0.Add(2*time.Minute)) {
		t.Errorf("after two refusals: %+v; want accepted at t0, refused (unreadable) at t0+2m", st)
	}
	if st.Refusals[RefusalEmpty] != 1 || st.Refusals[RefusalUnreadable] != 1 || st.Refusals[RefusalTooLarge] != 0 {
		t.Errorf("counts %v; want empty 1, unreadable 1, the others 0", st.Refusals)
	}
	v.Record(nil, t0.Add(3*time.Minute))
	if st := v.Status(); st.Refused != nil || !st.Accepted.Equal(t0.Add(3*time.Minute)) || st.Refusals[RefusalEmpty] != 1 {
		t.Errorf("after acceptance: %+v; want no refusal in force, the counts kept", st)
	}
}
