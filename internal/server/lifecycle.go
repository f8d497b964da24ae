package server

import (
	"time"

	"github.com/sylva-projects/osimages/internal/osimage"
)

// An image's lifecycle in the server is one value, life, changed by one
// pure function, transition: selection, the claim of a download and its
// outcome, a scrub that finds the stored file changed, and the collection
// of a deselected file go in; the new life and the effects the server must
// carry out come out. The rules that the rest of the server used to keep
// by convention are rules of transition:
//
//   - a record is removed from the table only when it is neither selected
//     nor stored, and never while its download runs: the download's own
//     end removes it (its goroutine holds the record until then);
//   - a download is cancelled when its image is deselected, and not
//     otherwise by selection;
//   - an attempt that ended for a reason that is not the image's fault (a
//     shutdown, a wait for space, giving way to the queue) is not counted.

// life is the lifecycle state of one image.
type life struct {
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

// downloading says whether a download of the image runs.
func (l life) downloading() bool { return l.Phase == PhaseDownloading || l.Phase == PhaseVerifying }

// due says whether the image needs a download at now.
func (l life) due(now time.Time) bool {
	if !l.Selected || l.Stored || l.WaitingForSpace {
		return false
	}
	return l.Phase == PhaseQueued || l.Phase == PhaseFailed && !now.Before(l.NextTry)
}

// effect is what the server must do after a transition.
type effect uint8

const (
	// removeRecord drops the image from the server's table.
	removeRecord effect = 1 << iota
	// cancelDownload cancels the download in progress.
	cancelDownload
	// kickQueue wakes the workers.
	kickQueue
	// publish signals that what is published may have changed.
	publish
)

func (e effect) has(f effect) bool { return e&f != 0 }

// event is what happens to an image.
type event interface{ isEvent() }

type (
	// selected: the desired set names the image (again).
	selected struct{}
	// deselected: the desired set no longer names it, at At.
	deselected struct{ At time.Time }
	// claimed: a worker starts its download.
	claimed struct{}
	// verifying: the download received its last byte, or ended, and is
	// verified and committed.
	verifying struct{}
	// downloaded: the download verified and stored it.
	downloaded struct{}
	// downloadEnded: the download ended without storing it.
	downloadEnded struct {
		Why ending
		// Reason says why, for operators; RetryAt is when a failed
		// image is due again.
		Reason  string
		RetryAt time.Time
	}
	// waitsForSpace: its download found no space free of reservations.
	waitsForSpace struct{ Reason string }
	// spaceFreed: a reservation was given back.
	spaceFreed struct{}
	// storedLost: the stored file is gone (the scrub found it changed,
	// and the store dropped it).
	storedLost struct{ Reason string }
	// collected: the collection deleted the stored file.
	collected struct{}
)

func (selected) isEvent()      {}
func (deselected) isEvent()    {}
func (claimed) isEvent()       {}
func (verifying) isEvent()     {}
func (downloaded) isEvent()    {}
func (downloadEnded) isEvent() {}
func (waitsForSpace) isEvent() {}
func (spaceFreed) isEvent()    {}
func (storedLost) isEvent()    {}
func (collected) isEvent()     {}

// ending is why a download ended without storing its image.
type ending uint8

const (
	// endedByShutdown: the server stops; the partial is kept.
	endedByShutdown ending = iota
	// endedByDeselection: the image was deselected while it downloaded.
	endedByDeselection
	// endedWaitingForSpace: it could not reserve its space yet.
	endedWaitingForSpace
	// endedGivingWay: too slow while others wait, or it held the space a
	// management image waits for.
	endedGivingWay
	// endedForNextRecord: one record of a fleet need failed, and another
	// is tried at once.
	endedForNextRecord
	// endedFailed: the attempt failed; it is retried at RetryAt.
	endedFailed
)

// transition is the one function that changes an image's life.
func transition(l life, ev event) (life, effect) {
	switch ev := ev.(type) {
	case selected:
		fx := kickQueue | publish
		l.Selected, l.DeselectedAt = true, time.Time{}
		if l.Phase == PhaseFailed {
			// New inputs may well fix what failed: try again now.
			l.NextTry, l.Attempts = time.Time{}, 0
		}
		return l, fx
	case deselected:
		if !l.Selected {
			return l, 0
		}
		l.Selected, l.DeselectedAt = false, ev.At
		switch {
		case l.downloading():
			// Its download's end removes it, unless it is selected again
			// meanwhile.
			return l, cancelDownload | publish | kickQueue
		case !l.Stored:
			return l, removeRecord | publish | kickQueue
		}
		return l, publish | kickQueue
	case claimed:
		l.Phase = PhaseDownloading
		l.Attempts++
		l.Reason = ""
		return l, kickQueue | publish
	case verifying:
		if l.Phase != PhaseDownloading {
			return l, 0
		}
		l.Phase = PhaseVerifying
		return l, publish
	case downloaded:
		l.Phase, l.Stored = PhaseReady, true
		l.Attempts, l.GaveWay, l.Reason = 0, false, ""
		l.NextTry = time.Time{}
		return l, kickQueue | publish
	case downloadEnded:
		return ended(l, ev)
	case waitsForSpace:
		l.WaitingForSpace = true
		l.Reason = ev.Reason
		return l, 0
	case spaceFreed:
		if !l.WaitingForSpace {
			return l, 0
		}
		l.WaitingForSpace = false
		return l, kickQueue
	case storedLost:
		if !l.Stored {
			return l, 0
		}
		l.Stored = false
		if !l.Selected {
			if l.downloading() {
				return l, publish
			}
			return l, removeRecord | publish
		}
		if !l.downloading() {
			l.Phase = PhaseQueued
		}
		l.Reason = ev.Reason
		return l, kickQueue | publish
	case collected:
		l.Stored = false
		if l.Selected {
			// Selected again while its file was deleted: download it.
			if !l.downloading() {
				l.Phase = PhaseQueued
			}
			return l, kickQueue | publish
		}
		if l.downloading() {
			return l, publish
		}
		return l, removeRecord | publish
	}
	return l, 0
}

// changeLocked puts ev through transition, and carries out its effects on
// the server's table, the download and the loops.
func (s *Server) changeLocked(sum osimage.SHA256, img *image, ev event) {
	var fx effect
	img.life, fx = transition(img.life, ev)
	if fx.has(cancelDownload) && img.cancel != nil {
		img.cancel()
	}
	if fx.has(removeRecord) {
		delete(s.images, sum)
		if s.filler != nil {
			s.filler.Forget(sum)
		}
	}
	if fx.has(kickQueue) {
		s.signal(s.kick)
	}
	if fx.has(publish) {
		s.signal(s.changed)
	}
}

// ended is the transition of a download that ended without storing its
// image: the only one that may remove a record whose download ran.
func ended(l life, ev downloadEnded) (life, effect) {
	fx := kickQueue | publish
	switch {
	case !l.Selected && !l.Stored:
		return l, removeRecord | fx
	case !l.Selected:
		l.Phase = PhaseReady
		return l, fx
	}
	switch ev.Why {
	case endedByShutdown:
		// Not a failed attempt; nothing is claimed after it.
		l.Phase = PhaseQueued
		l.Attempts = max(l.Attempts-1, 0)
		return l, publish
	case endedByDeselection:
		// Deselected, then selected again before the download ended.
		l.Phase = PhaseQueued
		l.Attempts = max(l.Attempts-1, 0)
	case endedWaitingForSpace:
		l.Phase = PhaseQueued
		l.Attempts = max(l.Attempts-1, 0)
		l.Reason = ev.Reason
		// WaitingForSpace was set when the reservation failed, under the
		// same lock as the releases that clear it.
		return l, publish
	case endedGivingWay:
		l.Phase = PhaseQueued
		l.Attempts = max(l.Attempts-1, 0)
		l.GaveWay = true
		l.Reason = ev.Reason
	case endedForNextRecord:
		l.Phase = PhaseQueued
		l.Reason = ev.Reason
	case endedFailed:
		l.Phase = PhaseFailed
		l.Reason = ev.Reason
		l.NextTry = ev.RetryAt
	}
	return l, fx
}
