package server

import (
	"fmt"
	"testing"
	"time"
)

var t0 = time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)

func TestTransitions(t *testing.T) {
	queued := life{Phase: PhaseQueued, Selected: true}
	downloading := life{Phase: PhaseDownloading, Selected: true, Attempts: 1}
	ready := life{Phase: PhaseReady, Selected: true, Stored: true}
	failed := life{Phase: PhaseFailed, Selected: true, Attempts: 3, NextTry: t0.Add(time.Hour), Reason: "tag unknown"}
	tests := []struct {
		name string
		from life
		ev   event
		want life
		fx   effect
	}{
		{"new inputs retry a failed image at once", failed, selected{},
			life{Phase: PhaseFailed, Selected: true, Reason: "tag unknown"}, kickQueue | publish},
		{"a claim counts an attempt", queued, claimed{},
			life{Phase: PhaseDownloading, Selected: true, Attempts: 1}, kickQueue | publish},
		{"the last byte: verified and committed", downloading, verifying{},
			life{Phase: PhaseVerifying, Selected: true, Attempts: 1}, publish},
		{"verifying is only for a download", queued, verifying{}, queued, 0},
		{"success resets the count", downloading, downloaded{},
			life{Phase: PhaseReady, Selected: true, Stored: true}, kickQueue | publish},
		{"a failure waits for its retry", downloading, downloadEnded{Why: endedFailed, Reason: "x", RetryAt: t0},
			life{Phase: PhaseFailed, Selected: true, Attempts: 1, Reason: "x", NextTry: t0}, kickQueue | publish},
		{"a shutdown is no failed attempt, and claims nothing", downloading, downloadEnded{Why: endedByShutdown},
			life{Phase: PhaseQueued, Selected: true}, publish},
		{"waiting for space is no failed attempt", downloading, downloadEnded{Why: endedWaitingForSpace, Reason: "w"},
			life{Phase: PhaseQueued, Selected: true, Reason: "w"}, publish},
		{"giving way goes behind", downloading, downloadEnded{Why: endedGivingWay, Reason: "slow"},
			life{Phase: PhaseQueued, Selected: true, GaveWay: true, Reason: "slow"}, kickQueue | publish},
		{"the next record is tried at once, the attempt counted", downloading, downloadEnded{Why: endedForNextRecord, Reason: "r"},
			life{Phase: PhaseQueued, Selected: true, Attempts: 1, Reason: "r"}, kickQueue | publish},
		{"deselected while downloading: cancelled, kept until its end", downloading, deselected{At: t0},
			life{Phase: PhaseDownloading, DeselectedAt: t0, Attempts: 1}, cancelDownload | publish | kickQueue},
		{"the end of a deselected download removes it", life{Phase: PhaseDownloading, DeselectedAt: t0}, downloadEnded{Why: endedByDeselection},
			life{Phase: PhaseDownloading, DeselectedAt: t0}, removeRecord | kickQueue | publish},
		{"deselected, then selected again before its end: queued again", life{Phase: PhaseDownloading, Selected: true, Attempts: 2}, downloadEnded{Why: endedByDeselection},
			life{Phase: PhaseQueued, Selected: true, Attempts: 1}, kickQueue | publish},
		{"a queued image deselected is removed", queued, deselected{At: t0},
			life{Phase: PhaseQueued, DeselectedAt: t0}, removeRecord | publish | kickQueue},
		{"a stored image deselected stays for its grace", ready, deselected{At: t0},
			life{Phase: PhaseReady, Stored: true, DeselectedAt: t0}, publish | kickQueue},
		{"a changed file of a selected image is downloaded again", ready, storedLost{Reason: "changed"},
			life{Phase: PhaseQueued, Selected: true, Reason: "changed"}, kickQueue | publish},
		{"a changed file of a deselected image goes", life{Phase: PhaseReady, Stored: true, DeselectedAt: t0}, storedLost{},
			life{Phase: PhaseReady, DeselectedAt: t0}, removeRecord | publish},
		{"collected", life{Phase: PhaseReady, Stored: true, DeselectedAt: t0}, collected{},
			life{Phase: PhaseReady, DeselectedAt: t0}, removeRecord | publish},
		{"collected while selected again: downloaded again, not lost", ready, collected{},
			life{Phase: PhaseQueued, Selected: true}, kickQueue | publish},
		{"space freed wakes a waiting image", life{Phase: PhaseQueued, Selected: true, WaitingForSpace: true}, spaceFreed{},
			life{Phase: PhaseQueued, Selected: true}, kickQueue},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, fx := transition(tt.from, tt.ev)
			if got != tt.want || fx != tt.fx {
				t.Errorf("transition(%+v, %T%+v)\n got %+v, %04b\nwant %+v, %04b", tt.from, tt.ev, tt.ev, got, fx, tt.want, tt.fx)
			}
		})
	}
}

// The rules, over every life and every event: a record whose download runs
// is removed only by that download's end; a selected or stored one never
// is; a download is cancelled only by a deselection; an attempt that ended
// for a reason that is not the image's fault is not counted.
func TestTransitionRules(t *testing.T) {
	events := []event{selected{}, deselected{At: t0}, claimed{}, verifying{}, downloaded{},
		downloadEnded{Why: endedByShutdown}, downloadEnded{Why: endedByDeselection}, downloadEnded{Why: endedWaitingForSpace},
		downloadEnded{Why: endedGivingWay}, downloadEnded{Why: endedForNextRecord}, downloadEnded{Why: endedFailed, RetryAt: t0},
		waitsForSpace{}, spaceFreed{}, storedLost{}, collected{}}
	n := 0
	for _, phase := range []Phase{PhaseQueued, PhaseDownloading, PhaseVerifying, PhaseReady, PhaseFailed} {
		for _, sel := range []bool{false, true} {
			for _, stored := range []bool{false, true} {
				for _, waiting := range []bool{false, true} {
					from := life{Phase: phase, Selected: sel, Stored: stored, WaitingForSpace: waiting, Attempts: 2}
					for _, ev := range events {
						n++
						to, fx := transition(from, ev)
						where := fmt.Sprintf("%+v on %T%+v -> %+v, %04b", from, ev, ev, to, fx)
						_, ends := ev.(downloadEnded)
						if fx.has(removeRecord) {
							if from.downloading() && !ends {
								t.Errorf("a downloading record removed by another than its download: %s", where)
							}
							if to.Selected || to.Stored {
								t.Errorf("a selected or stored record removed: %s", where)
							}
						}
						if _, desel := ev.(deselected); fx.has(cancelDownload) && !desel {
							t.Errorf("a download cancelled by another than a deselection: %s", where)
						}
						if e, ok := ev.(downloadEnded); ok && to.Selected && e.Why != endedFailed && e.Why != endedForNextRecord && to.Attempts > from.Attempts {
							t.Errorf("an attempt that was not the image's fault counted: %s", where)
						}
					}
				}
			}
		}
	}
	t.Logf("%d transitions checked", n)
}
