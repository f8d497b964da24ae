package controller

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sylva-projects/osimages/internal/osimage"
)

// metrics of the fleet controller.
type metrics struct {
	unserved    *prometheus.GaugeVec
	needed      *prometheus.GaugeVec
	catalogs    *prometheus.CounterVec
	state       *prometheus.GaugeVec
	preemptions *prometheus.CounterVec

	mu sync.Mutex
	// states holds each namespace's catalog state, to move the gauge.
	states map[string]string
	// running gives the start of each catalog run in progress.
	running func() map[string]time.Time
}

var runSecondsDesc = prometheus.NewDesc("osimages_catalog_run_seconds",
	"Age of the catalog run in progress in each namespace: a run that grows towards --catalog-run-timeout is stuck on its registries.",
	[]string{"namespace"}, nil)

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
			Help: "Catalog runs by namespace and result: published, failed, timeout (stopped at --catalog-run-timeout), refused (inputs too large or invalid), cancelled (inputs changed or gone).",
		}, []string{"namespace", "result"}),
		state: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "osimages_catalog_state",
			Help: "1 for the current state of each namespace's catalog: running, published, failed, timed-out, refused.",
		}, []string{"namespace", "state"}),
		preemptions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "osimages_catalog_slot_preemptions_total",
			Help: "Registry requests of a namespace's catalog cancelled (and made again later) to give their slot to a namespace below its share.",
		}, []string{"namespace"}),
		states:  map[string]string{},
		running: func() map[string]time.Time { return nil },
	}
	for _, c := range []prometheus.Collector{m.unserved, m.needed, m.catalogs, m.state, m.preemptions, runSeconds{m}} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *metrics) report(r osimage.CheckReport) {
	m.needed.WithLabelValues(r.Namespace).Set(float64(len(r.Images)))
	for _, s := range []osimage.ImageState{osimage.StateNotServed, osimage.StateNotAvailable} {
		m.unserved.WithLabelValues(r.Namespace, string(s)).Set(float64(r.Count(s)))
	}
}

// forget drops the series of a namespace no longer checked.
func (m *metrics) forget(namespace string) {
	m.needed.DeleteLabelValues(namespace)
	m.unserved.DeletePartialMatch(prometheus.Labels{"namespace": namespace})
}

func (m *metrics) catalogRun(namespace, result string) {
	m.catalogs.WithLabelValues(namespace, result).Inc()
}

// catalogState moves the namespace's state gauge to state.
func (m *metrics) catalogState(namespace, state string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if old, ok := m.states[namespace]; ok && old != state {
		m.state.DeleteLabelValues(namespace, old)
	}
	m.states[namespace] = state
	m.state.WithLabelValues(namespace, state).Set(1)
}

// forgetCatalog drops the catalog series of a namespace without inputs.
func (m *metrics) forgetCatalog(namespace string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.states, namespace)
	m.state.DeletePartialMatch(prometheus.Labels{"namespace": namespace})
}

// runSeconds computes osimages_catalog_run_seconds at scrape time.
type runSeconds struct{ m *metrics }

func (r runSeconds) Describe(ch chan<- *prometheus.Desc) { ch <- runSecondsDesc }

func (r runSeconds) Collect(ch chan<- prometheus.Metric) {
	now := time.Now()
	for ns, started := range r.m.running() {
		ch <- prometheus.MustNewConstMetric(runSecondsDesc, prometheus.GaugeValue, now.Sub(started).Seconds(), ns)
	}
}
