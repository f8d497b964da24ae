package server

import (
	"fmt"
	"math"

	"github.com/sylva-projects/osimages/internal/imagelife"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/servedset"
)

// Disk space: what each download may take, reserved before it starts, so
// that downloads together never fill the disk nor exceed --max-storage.

// reserveSpace reserves need bytes for the download of sum, or says why it
// cannot. need covers the bound the store enforces on the file (see
// servedset.Wanted.Bounds), so that a download never takes the space of another;
// archive-size counts too, as a cautious margin. When the disk (or
// --max-storage) cannot hold the image at all, the error fails it; when it
// could but for what downloads in progress reserved, the error is a
// *spaceWait and the image waits, without failing, until one of them ends.
//
// An image that declares no size is bounded by --max-image-size, which is
// more than most data volumes hold: when nothing else is reserved, its
// bound shrinks to the space there is, so that it is tried (and fails only
// if it really is larger) instead of being refused outright. It returns the
// bound reserved.
func (s *Server) reserveSpace(sum osimage.SHA256, w servedset.Wanted, bound, need int64) (int64, error) {
	why := "archive-size + size"
	if w.Desc.Size <= 0 {
		why = fmt.Sprintf("archive-size + --max-image-size %s, as the image declares no size", osimage.FormatBytes(bound))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var reserved int64
	for _, img := range s.images {
		reserved = osimage.AddSizes(reserved, img.reservedForSpace)
	}
	if w.IsNeed() {
		// The management selection's room is kept for it, downloaded or
		// not yet: a need never takes it.
		why += " (with the room of the management images not stored yet)"
		reserved = osimage.AddSizes(reserved, s.managementPendingLocked())
	}
	wait := func(msg string) (int64, error) {
		// Set under the lock that releaseSpace takes, so that a release
		// cannot slip between this check and the wait.
		s.changeLocked(sum, s.images[sum], imagelife.WaitsForSpace{Reason: msg})
		if !w.IsNeed() {
			s.yieldNeedsLocked(w.Key)
		}
		return 0, &spaceWait{msg: msg}
	}
	avail, err := s.cfg.Store.Available()
	if err != nil {
		return 0, fmt.Errorf("checking free disk space: %w", err)
	}
	free := int64(min(avail, math.MaxInt64))
	// A partial download kept from an earlier attempt holds part of the
	// space this one needs already.
	free = osimage.AddSizes(free, s.partialBytes(sum))
	if w.Desc.Size <= 0 {
		archive := need - bound
		room := free - s.cfg.FreeSpaceMargin
		if s.cfg.MaxStorage > 0 {
			room = min(room, s.cfg.MaxStorage-s.cfg.Store.Used())
		}
		if room -= archive; room < bound {
			if reserved > 0 {
				return wait(fmt.Sprintf("waiting for disk space: the image declares no size, so it may take all the space that is free (up to --max-image-size %s) once the downloads in progress, which reserved %s, end",
					osimage.FormatBytes(bound), osimage.FormatBytes(reserved)))
			}
			if room > 0 {
				bound, need = room, room+archive
				why = fmt.Sprintf("archive-size + the %s free, as the image declares no size", osimage.FormatBytes(bound))
			}
		}
	}
	if s.cfg.MaxStorage > 0 {
		used := s.cfg.Store.Used()
		if osimage.AddSizes(used, need) > s.cfg.MaxStorage {
			return 0, fmt.Errorf("not enough storage: the image needs %s (%s), %s are used, and --max-storage is %s; raise --max-storage or deselect images",
				osimage.FormatBytes(need), why, osimage.FormatBytes(used), osimage.FormatBytes(s.cfg.MaxStorage))
		}
		if osimage.AddSizes(osimage.AddSizes(used, reserved), need) > s.cfg.MaxStorage {
			return wait(fmt.Sprintf("waiting for storage: the image needs %s (%s), %s are used and %s reserved by downloads in progress, and --max-storage is %s",
				osimage.FormatBytes(need), why, osimage.FormatBytes(used), osimage.FormatBytes(reserved), osimage.FormatBytes(s.cfg.MaxStorage)))
		}
	}
	if free < osimage.AddSizes(need, s.cfg.FreeSpaceMargin) {
		return 0, fmt.Errorf("not enough free disk space: the image needs %s (%s) plus a margin of %s, and %s are free; grow the data volume or deselect images",
			osimage.FormatBytes(need), why, osimage.FormatBytes(s.cfg.FreeSpaceMargin), osimage.FormatBytes(free))
	}
	if free < osimage.AddSizes(osimage.AddSizes(need, reserved), s.cfg.FreeSpaceMargin) {
		return wait(fmt.Sprintf("waiting for disk space: the image needs %s (%s) plus a margin of %s, %s are free and downloads in progress reserved %s",
			osimage.FormatBytes(need), why, osimage.FormatBytes(s.cfg.FreeSpaceMargin), osimage.FormatBytes(free), osimage.FormatBytes(reserved)))
	}
	s.images[sum].reservedForSpace = need
	return bound, nil
}

// managementPendingLocked is the room the management images that are
// selected, not stored and not downloading yet will reserve.
func (s *Server) managementPendingLocked() int64 {
	var n int64
	for _, img := range s.images {
		if !img.Selected || img.IsNeed() || img.Stored || img.reservedForSpace > 0 {
			continue
		}
		if _, need, err := img.Bounds(s.cfg.MaxImageSize); err == nil {
			n = osimage.AddSizes(n, need)
		}
	}
	return n
}

// yieldNeedsLocked ends the downloads of fleet needs that hold space, so
// that the management image key, which waits for space, gets it: a need
// never blocks the management selection. They go back to the queue with
// their partial files kept.
func (s *Server) yieldNeedsLocked(key string) {
	for _, img := range s.images {
		if img.IsNeed() && img.reservedForSpace > 0 && img.yield != nil {
			s.log.Info("a fleet need's download gives way to a management image that waits for space", "sha256", img.SHA256, "management", key)
			img.yield(&yieldError{image: key})
		}
	}
}

// partialBytes is the disk space the kept partial download of sum takes.
func (s *Server) partialBytes(sum osimage.SHA256) int64 {
	partials, _ := s.cfg.Store.Partials()
	for _, p := range partials {
		if p.SHA256 == sum {
			return p.Bytes
		}
	}
	return 0
}

// spaceWait says that an image waits for the space that downloads in
// progress reserved.
type spaceWait struct{ msg string }

func (e *spaceWait) Error() string { return e.msg }

// releaseSpace gives back what the download of sum reserved; the images
// waiting for space try again.
func (s *Server) releaseSpace(sum osimage.SHA256) {
	s.mu.Lock()
	defer s.mu.Unlock()
	img, ok := s.images[sum]
	if !ok || img.reservedForSpace == 0 {
		return
	}
	img.reservedForSpace = 0
	for other, img := range s.images {
		s.changeLocked(other, img, imagelife.SpaceFreed{})
	}
	s.signal(s.kick)
}
