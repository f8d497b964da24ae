package server

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/servedset"
	"github.com/sylva-projects/osimages/internal/serverio"
)

// inputsGuard is what the server knows of its inputs: when the inputs in
// force were accepted, and the refusal of newer ones, if any. The status
// page and the metrics show it.
type inputsGuard struct {
	mu        sync.Mutex
	accepted  time.Time
	refusal   *serverio.RefusedError
	refusedAt time.Time
	counts    map[serverio.Refusal]int
}

// InputsStatus is the state of the inputs, as the status page shows it.
type InputsStatus struct {
	// Accepted is when the inputs read were last found good (zero before).
	Accepted time.Time
	// Refused is the refusal of the newest inputs read, nil when they are
	// the ones in force; RefusedAt is when they were refused.
	Refused   *serverio.RefusedError
	RefusedAt time.Time
	// Refusals counts the refusals since the start, by reason.
	Refusals map[serverio.Refusal]int
}

// ReportInputs records the fate of the newest inputs read: nil when they
// are in force, their refusal otherwise. Inputs.Report takes it.
func (s *Server) ReportInputs(err error) {
	g := &s.inputs
	g.mu.Lock()
	defer g.mu.Unlock()
	now := s.cfg.Now()
	if err == nil {
		g.accepted, g.refusal = now, nil
		return
	}
	r := serverio.AsRefused(err)
	if g.counts == nil {
		g.counts = map[serverio.Refusal]int{}
	}
	g.counts[r.Reason]++
	g.refusal, g.refusedAt = r, now
}

// InputsStatus returns the state of the inputs.
func (s *Server) InputsStatus() InputsStatus {
	g := &s.inputs
	g.mu.Lock()
	defer g.mu.Unlock()
	counts := make(map[serverio.Refusal]int, len(serverio.Refusals))
	for _, r := range serverio.Refusals {
		counts[r] = g.counts[r]
	}
	return InputsStatus{Accepted: g.accepted, Refused: g.refusal, RefusedAt: g.refusedAt, Refusals: counts}
}

// Admit decides whether wanted, the selection of new inputs, may replace
// the served set. It refuses (a *serverio.RefusedError) a set that would not fit in
// the served-images ConfigMap, and, unless Config.AllowEmpty, an empty set
// while images are served: an emptied or half-written os_images, or values
// that lost their selectors, must not take every image away. Before the
// first set is in force, what is served is what the publisher published
// last (a restart on broken inputs is refused too), or, when that cannot be
// read, what the store holds.
func (s *Server) Admit(ctx context.Context, wanted map[osimage.SHA256]servedset.Wanted) error {
	// The largest the output can be: every entry still "available: false".
	out := osimage.ServedOutput{Set: osimage.ServedSet{}, Filenames: osimage.ServedFilenames{}}
	for sum, w := range wanted {
		out.Set[sum] = osimage.ServedImage{ImageKey: w.Key}
		out.Filenames[sum] = w.ServedAs()
	}
	if _, err := out.ConfigMapData("the served set"); err != nil {
		var tooLarge *osimage.SizeError
		if errors.As(err, &tooLarge) {
			return &serverio.RefusedError{Reason: serverio.RefusalTooLarge, Err: fmt.Errorf("the inputs select too many images: %w", err)}
		}
		return err
	}
	if len(wanted) > 0 || s.cfg.AllowEmpty {
		return nil
	}
	n, where := s.servedNow(ctx)
	if n == 0 {
		return nil
	}
	return &serverio.RefusedError{Reason: serverio.RefusalEmpty, Err: fmt.Errorf(
		"the inputs select no image, while %d are %s: refused, so that an emptied or half-written os_images, or values that lost their selectors, cannot take every image away; check the os_images document and the selectors of the values, or, to empty the served set on purpose, run the server with --allow-empty",
		n, where)}
}

// servedNow counts the images served, and says where from.
func (s *Server) servedNow(ctx context.Context) (int, string) {
	s.mu.Lock()
	ready := s.ready
	selected, stored := 0, 0
	for _, img := range s.images {
		if img.Selected {
			selected++
		}
		if img.Stored {
			stored++
		}
	}
	s.mu.Unlock()
	if ready {
		return selected, "served"
	}
	if r, ok := s.cfg.Publisher.(PublishedReader); ok {
		published, err := r.Published(ctx)
		if err == nil {
			return len(published), "published at the output"
		}
		s.log.Warn("the served set published last cannot be read; the images stored count as served", "error", err)
	}
	return stored, "stored in the data directory"
}
