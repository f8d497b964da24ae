package imagelife

import (
	"fmt"
	"testing"
	"time"
)

var t0 = time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)

func TestTransitions(t *testing.T) {
	queued := Life{Phase: PhaseQueued, Selected: true}
	downloading := Life{Phase: PhaseDownloading, Selected: true, Attempts: 1}
	ready := Life{Phase: PhaseReady, Selected: true, Stored: true}
	failed := Life{Phase: PhaseFailed, Selected: true, Attempts: 3, NextTry: t0.Add(time.Hour), Reason: "tag unknown"}
	tests := []struct {
		name string
		from Life
		ev   Event
		want Life
		fx   Effect
	}{
		{"new inputs retry a failed image at once", failed, Selected{},
			Life{Phase: PhaseFailed, Selected: true, Reason: "tag unknown"}, KickQueue | Publish},
		{"a claim counts an attempt", queued, Claimed{},
			Life{Phase: PhaseDownloading, Selected: true, Attempts: 1}, KickQueue | Publish},
		{"the last byte: verified and committed", downloading, Verifying{},
			Life{Phase: PhaseVerifying, Selected: true, Attempts: 1}, Publish},
		{"Verifying is only for a download", queued, Verifying{}, queued, 0},
		{"success resets the count", downloading, Downloaded{},
			Life{Phase: PhaseReady, Selected: true, Stored: true}, KickQueue | Publish},
		{"a failure waits for its retry", downloading, DownloadEnded{Why: EndedFailed, Reason: "x", RetryAt: t0},
			Life{Phase: PhaseFailed, Selected: true, Attempts: 1, Reason: "x", NextTry: t0}, KickQueue | Publish},
		{"a shutdown is no failed attempt, and claims nothing", downloading, DownloadEnded{Why: EndedByShutdown},
			Life{Phase: PhaseQueued, Selected: true}, Publish},
		{"waiting for space is no failed attempt", downloading, DownloadEnded{Why: EndedWaitingForSpace, Reason: "w"},
			Life{Phase: PhaseQueued, Selected: true, Reason: "w"}, Publish},
		{"giving way goes behind", downloading, DownloadEnded{Why: EndedGivingWay, Reason: "slow"},
			Life{Phase: PhaseQueued, Selected: true, GaveWay: true, Reason: "slow"}, KickQueue | Publish},
		{"the next record is tried at once, the attempt counted", downloading, DownloadEnded{Why: EndedForNextRecord, Reason: "r"},
			Life{Phase: PhaseQueued, Selected: true, Attempts: 1, Reason: "r"}, KickQueue | Publish},
		{"Deselected while downloading: cancelled, kept until its end", downloading, Deselected{At: t0},
			Life{Phase: PhaseDownloading, DeselectedAt: t0, Attempts: 1}, CancelDownload | Publish | KickQueue},
		{"the end of a Deselected download removes it", Life{Phase: PhaseDownloading, DeselectedAt: t0}, DownloadEnded{Why: EndedByDeselection},
			Life{Phase: PhaseDownloading, DeselectedAt: t0}, RemoveRecord | KickQueue | Publish},
		{"Deselected, then Selected again before its end: queued again", Life{Phase: PhaseDownloading, Selected: true, Attempts: 2}, DownloadEnded{Why: EndedByDeselection},
			Life{Phase: PhaseQueued, Selected: true, Attempts: 1}, KickQueue | Publish},
		{"a queued image Deselected is removed", queued, Deselected{At: t0},
			Life{Phase: PhaseQueued, DeselectedAt: t0}, RemoveRecord | Publish | KickQueue},
		{"a stored image Deselected stays for its grace", ready, Deselected{At: t0},
			Life{Phase: PhaseReady, Stored: true, DeselectedAt: t0}, Publish | KickQueue},
		{"a changed file of a Selected image is Downloaded again", ready, StoredLost{Reason: "changed"},
			Life{Phase: PhaseQueued, Selected: true, Reason: "changed"}, KickQueue | Publish},
		{"a changed file of a Deselected image goes", Life{Phase: PhaseReady, Stored: true, DeselectedAt: t0}, StoredLost{},
			Life{Phase: PhaseReady, DeselectedAt: t0}, RemoveRecord | Publish},
		{"Collected", Life{Phase: PhaseReady, Stored: true, DeselectedAt: t0}, Collected{},
			Life{Phase: PhaseReady, DeselectedAt: t0}, RemoveRecord | Publish},
		{"Collected while Selected again: Downloaded again, not lost", ready, Collected{},
			Life{Phase: PhaseQueued, Selected: true}, KickQueue | Publish},
		{"space freed wakes a waiting image", Life{Phase: PhaseQueued, Selected: true, WaitingForSpace: true}, SpaceFreed{},
			Life{Phase: PhaseQueued, Selected: true}, KickQueue},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, fx := Transition(tt.from, tt.ev)
			if got != tt.want || fx != tt.fx {
				t.Errorf("Transition(%+v, %T%+v)\n got %+v, %04b\nwant %+v, %04b", tt.from, tt.ev, tt.ev, got, fx, tt.want, tt.fx)
			}
		})
	}
}

// The rules, over every life and every event: a record whose download runs
// is removed only by that download's end; a selected or stored one never
// is; a download is cancelled only by a deselection; an attempt that ended
// for a reason that is not the image's fault is not counted.
func TestTransitionRules(t *testing.T) {
	events := []Event{Selected{}, Deselected{At: t0}, Claimed{}, Verifying{}, Downloaded{},
		DownloadEnded{Why: EndedByShutdown}, DownloadEnded{Why: EndedByDeselection}, DownloadEnded{Why: EndedWaitingForSpace},
		DownloadEnded{Why: EndedGivingWay}, DownloadEnded{Why: EndedForNextRecord}, DownloadEnded{Why: EndedFailed, RetryAt: t0},
		WaitsForSpace{}, SpaceFreed{}, StoredLost{}, Collected{}}
	n := 0
	for _, phase := range []Phase{PhaseQueued, PhaseDownloading, PhaseVerifying, PhaseReady, PhaseFailed} {
		for _, sel := range []bool{false, true} {
			for _, stored := range []bool{false, true} {
				for _, waiting := range []bool{false, true} {
					from := Life{Phase: phase, Selected: sel, Stored: stored, WaitingForSpace: waiting, Attempts: 2}
					for _, ev := range events {
						n++
						to, fx := Transition(from, ev)
						where := fmt.Sprintf("%+v on %T%+v -> %+v, %04b", from, ev, ev, to, fx)
						_, ends := ev.(DownloadEnded)
						if fx.Has(RemoveRecord) {
							if from.Downloading() && !ends {
								t.Errorf("a downloading record removed by another than its download: %s", where)
							}
							if to.Selected || to.Stored {
								t.Errorf("a Selected or stored record removed: %s", where)
							}
						}
						if _, desel := ev.(Deselected); fx.Has(CancelDownload) && !desel {
							t.Errorf("a download cancelled by another than a deselection: %s", where)
						}
						if e, ok := ev.(DownloadEnded); ok && to.Selected && e.Why != EndedFailed && e.Why != EndedForNextRecord && to.Attempts > from.Attempts {
							t.Errorf("an attempt that was not the image's fault counted: %s", where)
						}
					}
				}
			}
		}
	}
	t.Logf("%d transitions checked", n)
}
