package server

import (
	"github.com/prometheus/client_golang/prometheus"
)

// ServerPhase is what the server as a whole is at, beside the phase of each
// image.
type ServerPhase string

const (
	// ServerStarting: the inputs are being read for the first time.
	ServerStarting ServerPhase = "starting"
	// ServerWaitingForCatalog: the catalog ConfigMap is absent or still
	// empty, as the chart creates it for the catalog Job to fill. A state
	// of a fresh install, not an error: the server is up (its status page,
	// health and metrics answer), selects nothing, and keeps the images it
	// has stored.
	ServerWaitingForCatalog ServerPhase = "waiting-for-catalog"
	// ServerServing: the catalog and values are loaded and the served set
	// is known.
	ServerServing ServerPhase = "serving"
)

var serverPhases = []ServerPhase{ServerStarting, ServerWaitingForCatalog, ServerServing}

// Condition says, the way Kubernetes conditions do, whether the server has
// loaded its catalog, and if not why.
type Condition struct {
	Type, Status, Reason, Message string
}

// CatalogLoadedCondition is the type of Server.Condition.
const CatalogLoadedCondition = "CatalogLoaded"

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
func (s *Server) Phase() ServerPhase {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.phaseLocked()
}

func (s *Server) phaseLocked() ServerPhase {
	switch {
	case s.ready:
		return ServerServing
	case s.waiting != "":
		return ServerWaitingForCatalog
	}
	return ServerStarting
}

// Condition returns the server's CatalogLoaded condition.
func (s *Server) Condition() Condition {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := Condition{Type: CatalogLoadedCondition, Status: "False"}
	switch s.phaseLocked() {
	case ServerServing:
		c.Status, c.Reason, c.Message = "True", "Loaded", "the catalog and values are loaded"
	case ServerWaitingForCatalog:
		c.Reason, c.Message = "WaitingForCatalog", s.waiting
	default:
		c.Reason, c.Message = "Starting", "the inputs are being read"
	}
	return c
}

// bindPhase exports the server's phase: 1 for the current one, 0 for the
// others, so that an alert can ask how long it has been waiting.
func (m *Metrics) bindPhase(s *Server) {
	desc := prometheus.NewDesc("osimages_server_phase", "The image server's phase (starting, waiting-for-catalog, serving): 1 for the current one.", []string{"phase"}, nil)
	m.registry.MustRegister(collectorFunc{descs: []*prometheus.Desc{desc}, collect: func(ch chan<- prometheus.Metric) {
		current := s.Phase()
		for _, p := range serverPhases {
			v := 0.0
			if p == current {
				v = 1
			}
			ch <- prometheus.MustNewConstMetric(desc, prometheus.GaugeValue, v, string(p))
		}
	}})
}
