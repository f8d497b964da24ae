package server

import (
	"github.com/sylva-projects/osimages/internal/imagelife"
	"github.com/sylva-projects/osimages/internal/osimage"
)

// changeLocked puts ev through imagelife.Transition, and carries out its effects on
// the server's table, the download and the loops.
func (s *Server) changeLocked(sum osimage.SHA256, img *image, ev imagelife.Event) {
	var fx imagelife.Effect
	img.Life, fx = imagelife.Transition(img.Life, ev)
	if fx.Has(imagelife.CancelDownload) && img.cancel != nil {
		img.cancel()
	}
	if fx.Has(imagelife.RemoveRecord) {
		delete(s.images, sum)
		if s.filler != nil {
			s.filler.Forget(sum)
		}
	}
	if fx.Has(imagelife.KickQueue) {
		s.signal(s.kick)
	}
	if fx.Has(imagelife.Publish) {
		s.signal(s.changed)
	}
}
