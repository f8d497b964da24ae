package server

import (
	"context"
	"errors"
	"fmt"

	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/servedset"
	"github.com/sylva-projects/osimages/internal/serverio"
)

// ReportInputs records the fate of the newest inputs read: nil when they
// are in force, their refusal otherwise. Inputs.Report takes it.
func (s *Server) ReportInputs(err error) { s.inputs.Record(err, s.cfg.Now()) }

// InputsStatus returns the state of the inputs.
func (s *Server) InputsStatus() serverio.InputsStatus { return s.inputs.Status() }

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
