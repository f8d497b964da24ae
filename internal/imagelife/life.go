// Package imagelife is an image's lifecycle in the image server: one
// value, Life, changed by one pure function, Transition. Selection, the
// claim of a download and its outcome, a scrub that finds the stored file
// changed, and the collection of a deselected file go in; the new life and
// the effects the server must carry out come out. The rules that the rest
// of the server used to keep by convention are rules of Transition:
//
//   - a record is removed from the table only when it is neither selected
//     nor stored, and never while its download runs: the download's own
//     end removes it (its goroutine holds the record until then);
//   - a download is cancelled when its image is deselected, and not
//     otherwise by selection;
//   - an attempt that ended for a reason that is not the image's fault (a
//     shutdown, a wait for space, giving way to the queue) is not counted.
package imagelife

import "time"

// Phase is where an image is in the image server; a replica's state
// carries it to its peers (replica.Image).
type Phase string

// The phases of an image.
const (
	PhaseQueued      Phase = "queued"
	PhaseDownloading Phase = "downloading"
	PhaseVerifying   Phase = "verifying"
	PhaseReady       Phase = "ready"
	PhaseFailed      Phase = "failed"
)

// Life is the lifecycle state of one image.
type Life struct {
	Phase    Phase
	Selected bool
	// DeselectedAt is when it was last deselected (zero while selected):
	// the grace of the collection counts from there.
	DeselectedAt time.Time
	Stored       bool
	// Attempts counts the failed attempts since the last success or new
	// inputs, for the backoff; NextTry is when a failed image is due.
	Attempts int
	NextTry  time.Time
	// GaveWay: its download was too slow (or held space a management
	// image waits for) and went back behind the images that did not.
	GaveWay bool
	// WaitingForSpace: it waits for the space downloads in progress
	// reserved, and is not claimed until one of them ends.
	WaitingForSpace bool
	// Reason is why it is not ready, for operators.
	Reason string
}

// Downloading says whether a download of the image runs.
func (l Life) Downloading() bool {
	return l.Phase == PhaseDownloading || l.Phase == PhaseVerifying
}

// Due says whether the image needs a download at now.
func (l Life) Due(now time.Time) bool {
	if !l.Selected || l.Stored || l.WaitingForSpace {
		return false
	}
	return l.Phase == PhaseQueued || l.Phase == PhaseFailed && !now.Before(l.NextTry)
}

// Effect is what the server must do after a transition.
type Effect uint8

const (
	// RemoveRecord drops the image from the server's table.
	RemoveRecord Effect = 1 << iota
	// CancelDownload cancels the download in progress.
	CancelDownload
	// KickQueue wakes the workers.
	KickQueue
	// Publish signals that what is published may have changed.
	Publish
)

func (e Effect) Has(f Effect) bool { return e&f != 0 }

// Event is what happens to an image.
type Event interface{ isEvent() }

type (
	// Selected: the desired set names the image (again).
	Selected struct{}
	// Deselected: the desired set no longer names it, at At.
	Deselected struct{ At time.Time }
	// Claimed: a worker starts its download.
	Claimed struct{}
	// Verifying: the download received its last byte, or ended, and is
	// verified and committed.
	Verifying struct{}
	// Downloaded: the download verified and stored it.
	Downloaded struct{}
	// DownloadEnded: the download ended without storing it.
	DownloadEnded struct {
		Why Ending
		// Reason says why, for operators; RetryAt is when a failed
		// image is due again.
		Reason  string
		RetryAt time.Time
	}
	// WaitsForSpace: its download found no space free of reservations.
	WaitsForSpace struct{ Reason string }
	// SpaceFreed: a reservation was given back.
	SpaceFreed struct{}
	// StoredLost: the stored file is gone (the scrub found it changed,
	// and the store dropped it).
	StoredLost struct{ Reason string }
	// Collected: the collection deleted the stored file.
	Collected struct{}
)

func (Selected) isEvent()      {}
func (Deselected) isEvent()    {}
func (Claimed) isEvent()       {}
func (Verifying) isEvent()     {}
func (Downloaded) isEvent()    {}
func (DownloadEnded) isEvent() {}
func (WaitsForSpace) isEvent() {}
func (SpaceFreed) isEvent()    {}
func (StoredLost) isEvent()    {}
func (Collected) isEvent()     {}

// Ending is why a download ended without storing its image.
type Ending uint8

const (
	// EndedByShutdown: the server stops; the partial is kept.
	EndedByShutdown Ending = iota
	// EndedByDeselection: the image was deselected while it downloaded.
	EndedByDeselection
	// EndedWaitingForSpace: it could not reserve its space yet.
	EndedWaitingForSpace
	// EndedGivingWay: too slow while others wait, or it held the space a
	// management image waits for.
	EndedGivingWay
	// EndedForNextRecord: one record of a fleet need failed, and another
	// is tried at once.
	EndedForNextRecord
	// EndedFailed: the attempt failed; it is retried at RetryAt.
	EndedFailed
)

// Transition is the one function that changes an image's life.
func Transition(l Life, ev Event) (Life, Effect) {
	switch ev := ev.(type) {
	case Selected:
		fx := KickQueue | Publish
		l.Selected, l.DeselectedAt = true, time.Time{}
		if l.Phase == PhaseFailed {
			// New inputs may well fix what failed: try again now.
			l.NextTry, l.Attempts = time.Time{}, 0
		}
		return l, fx
	case Deselected:
		if !l.Selected {
			return l, 0
		}
		l.Selected, l.DeselectedAt = false, ev.At
		switch {
		case l.Downloading():
			// Its download's end removes it, unless it is selected again
			// meanwhile.
			return l, CancelDownload | Publish | KickQueue
		case !l.Stored:
			return l, RemoveRecord | Publish | KickQueue
		}
		return l, Publish | KickQueue
	case Claimed:
		l.Phase = PhaseDownloading
		l.Attempts++
		l.Reason = ""
		return l, KickQueue | Publish
	case Verifying:
		if l.Phase != PhaseDownloading {
			return l, 0
		}
		l.Phase = PhaseVerifying
		return l, Publish
	case Downloaded:
		l.Phase, l.Stored = PhaseReady, true
		l.Attempts, l.GaveWay, l.Reason = 0, false, ""
		l.NextTry = time.Time{}
		return l, KickQueue | Publish
	case DownloadEnded:
		return ended(l, ev)
	case WaitsForSpace:
		l.WaitingForSpace = true
		l.Reason = ev.Reason
		return l, 0
	case SpaceFreed:
		if !l.WaitingForSpace {
			return l, 0
		}
		l.WaitingForSpace = false
		return l, KickQueue
	case StoredLost:
		if !l.Stored {
			return l, 0
		}
		l.Stored = false
		if !l.Selected {
			if l.Downloading() {
				return l, Publish
			}
			return l, RemoveRecord | Publish
		}
		if !l.Downloading() {
			l.Phase = PhaseQueued
		}
		l.Reason = ev.Reason
		return l, KickQueue | Publish
	case Collected:
		l.Stored = false
		if l.Selected {
			// Selected again while its file was deleted: download it.
			if !l.Downloading() {
				l.Phase = PhaseQueued
			}
			return l, KickQueue | Publish
		}
		if l.Downloading() {
			return l, Publish
		}
		return l, RemoveRecord | Publish
	}
	return l, 0
}

// ended is the transition of a download that ended without storing its
// image: the only one that may remove a record whose download ran.
func ended(l Life, ev DownloadEnded) (Life, Effect) {
	fx := KickQueue | Publish
	switch {
	case !l.Selected && !l.Stored:
		return l, RemoveRecord | fx
	case !l.Selected:
		l.Phase = PhaseReady
		return l, fx
	}
	switch ev.Why {
	case EndedByShutdown:
		// Not a failed attempt; nothing is claimed after it.
		l.Phase = PhaseQueued
		l.Attempts = max(l.Attempts-1, 0)
		return l, Publish
	case EndedByDeselection:
		// Deselected, then selected again before the download ended.
		l.Phase = PhaseQueued
		l.Attempts = max(l.Attempts-1, 0)
	case EndedWaitingForSpace:
		l.Phase = PhaseQueued
		l.Attempts = max(l.Attempts-1, 0)
		l.Reason = ev.Reason
		// WaitingForSpace was set when the reservation failed, under the
		// same lock as the releases that clear it.
		return l, Publish
	case EndedGivingWay:
		l.Phase = PhaseQueued
		l.Attempts = max(l.Attempts-1, 0)
		l.GaveWay = true
		l.Reason = ev.Reason
	case EndedForNextRecord:
		l.Phase = PhaseQueued
		l.Reason = ev.Reason
	case EndedFailed:
		l.Phase = PhaseFailed
		l.Reason = ev.Reason
		l.NextTry = ev.RetryAt
	}
	return l, fx
}
