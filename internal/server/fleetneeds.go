package server

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sylva-projects/osimages/internal/osimage"
)

// The fleet's needs (--serve-fleet-needs): the images the server serves
// because workload clusters need them come in through SetDesired like any
// other; what the policy refuses is kept here, published beside the
// served set (osimage.RefusedNeedsKey), shown on the status page and
// counted in a metric.

// SetRefusedNeeds replaces the fleet's needs refused by policy. Call it
// before SetDesired, which publishes them with the served set.
func (s *Server) SetRefusedNeeds(r osimage.RefusedNeeds) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.refusedNeeds = r
	s.signal(s.changed)
}

// RefusedNeeds are the fleet's needs refused by policy.
func (s *Server) RefusedNeeds() osimage.RefusedNeeds {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.refusedNeeds
}

// fleetNeedsCollector exports osimages_fleet_needs_refused.
type fleetNeedsCollector struct {
	s    *Server
	desc *prometheus.Desc
}

func newFleetNeedsCollector(s *Server) fleetNeedsCollector {
	return fleetNeedsCollector{s: s, desc: prometheus.NewDesc("osimages_fleet_needs_refused",
		"Images some workload namespace needs that the image server refuses to serve (--serve-fleet-needs), by namespace and reason: registry-not-allowed, uri-not-allowed, quota-images, quota-bytes, no-record, invalid.",
		[]string{"namespace", "reason"}, nil)}
}

func (c fleetNeedsCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c fleetNeedsCollector) Collect(ch chan<- prometheus.Metric) {
	type key struct{ ns, reason string }
	counts := map[key]int{}
	for _, r := range c.s.RefusedNeeds() {
		counts[key{r.Namespace, r.Reason}]++
	}
	for k, n := range counts {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(n), k.ns, k.reason)
	}
}
