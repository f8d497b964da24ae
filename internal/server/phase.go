package server

import "github.com/sylva-projects/osimages/internal/imagehttp"

// WaitForCatalog records why the server has nothing to select from yet. It
// changes nothing once a catalog was loaded: later faults of the inputs
// leave the last good ones in force.
func (s *Server) WaitForCatalog(why error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.ready {
		s.waiting = why.Error()
	}
}

// Phase returns the server's phase.
func (s *Server) Phase() imagehttp.ServerPhase {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.phaseLocked()
}

func (s *Server) phaseLocked() imagehttp.ServerPhase {
	switch {
	case s.ready:
		return imagehttp.ServerServing
	case s.waiting != "":
		return imagehttp.ServerWaitingForCatalog
	}
	return imagehttp.ServerStarting
}

// Condition returns the server's CatalogLoaded condition.
func (s *Server) Condition() imagehttp.Condition {
	s.mu.Lock()
	defer s.mu.Unlock()
	return imagehttp.ConditionOf(s.phaseLocked(), s.waiting)
}
