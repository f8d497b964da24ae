package controller

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sylva-projects/osimages/internal/fleet"
)

// metrics of the fleet controller.
type metrics struct {
	unserved *prometheus.GaugeVec
	needed   *prometheus.GaugeVec
	catalogs *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		unserved: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "osimages_cluster_images_unserved",
			Help: "Images a workload-cluster namespace uses or will use that the management cluster does not serve (state not-served) or not yet (state not-available): render would fail.",
		}, []string{"namespace", "state"}),
		needed: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "osimages_cluster_images_needed",
			Help: "Images a workload-cluster namespace uses or will use (its Metal3 objects and the picks of its values).",
		}, []string{"namespace"}),
		catalogs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "osimages_catalog_runs_total",
			Help: "Catalog resolutions by namespace and result (published, failed).",
		}, []string{"namespace", "result"}),
	}
	for _, c := range []prometheus.Collector{m.unserved, m.needed, m.catalogs} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *metrics) report(r fleet.Report) {
	m.needed.WithLabelValues(r.Namespace).Set(float64(len(r.Images)))
	for _, s := range []fleet.State{fleet.StateNotServed, fleet.StateNotAvailable} {
		m.unserved.WithLabelValues(r.Namespace, string(s)).Set(float64(r.Count(s)))
	}
}

// forget drops the series of a namespace no longer checked.
func (m *metrics) forget(namespace string) {
	m.needed.DeleteLabelValues(namespace)
	m.unserved.DeletePartialMatch(prometheus.Labels{"namespace": namespace})
}

func (m *metrics) catalogRun(namespace string, ok bool) {
	result := "failed"
	if ok {
		result = "published"
	}
	m.catalogs.WithLabelValues(namespace, result).Inc()
}
