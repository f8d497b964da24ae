package serverio

import (
	"sync"
	"time"
)

// Verdicts records the fate of the inputs read: when the inputs in force
// were accepted, and the refusal of newer ones, if any. The status page
// and the metrics show it. The zero value is ready to use.
type Verdicts struct {
	mu        sync.Mutex
	accepted  time.Time
	refusal   *RefusedError
	refusedAt time.Time
	counts    map[Refusal]int
}

// InputsStatus is the state of the inputs, as the status page shows it.
type InputsStatus struct {
	// Accepted is when the inputs read were last found good (zero before).
	Accepted time.Time
	// Refused is the refusal of the newest inputs read, nil when they are
	// the ones in force; RefusedAt is when they were refused.
	Refused   *RefusedError
	RefusedAt time.Time
	// Refusals counts the refusals since the start, by reason.
	Refusals map[Refusal]int
}

// Record takes the fate of the newest inputs read, at now: nil when they
// are in force, their refusal otherwise.
func (v *Verdicts) Record(err error, now time.Time) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if err == nil {
		v.accepted, v.refusal = now, nil
		return
	}
	r := AsRefused(err)
	if v.counts == nil {
		v.counts = map[Refusal]int{}
	}
	v.counts[r.Reason]++
	v.refusal, v.refusedAt = r, now
}

// Status returns the state of the inputs: every reason counted, 0
// included.
func (v *Verdicts) Status() InputsStatus {
	v.mu.Lock()
	defer v.mu.Unlock()
	counts := make(map[Refusal]int, len(Refusals))
	for _, r := range Refusals {
		counts[r] = v.counts[r]
	}
	return InputsStatus{Accepted: v.accepted, Refused: v.refusal, RefusedAt: v.refusedAt, Refusals: counts}
}
