package propagate

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// collector holds the controller's Prometheus metrics.
//
// The copy counts are computed at scrape time from the informer cache with
// Decide, rather than kept as counters by the reconciler, so that they are
// true of what the cluster holds (a namespace deleted, a copy edited by
// hand) and are reported by every replica, leader or not.
type collector struct {
	writes *prometheus.CounterVec
	errors *prometheus.CounterVec

	mu       sync.Mutex
	lastSync map[string]time.Time

	copiesDesc, sourceDesc, sinceDesc *prometheus.Desc

	// set once the controller exists: the collector reads through it.
	rules    []Rule
	reader   client.Reader
	observer *observer
	ready    func() bool
	adopt    bool
	now      func() time.Time
}

func newMetrics(rules []Rule) *collector {
	m := &collector{
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "osimages_propagate_writes_total",
			Help: "Writes to copies, by rule and action (create, update, delete, mark_stale).",
		}, []string{"rule", "action"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "osimages_propagate_reconcile_errors_total",
			Help: "Reconciles of a copy that failed (reading the cache or writing to the apiserver), by rule.",
		}, []string{"rule"}),
		lastSync: map[string]time.Time{},
		copiesDesc: prometheus.NewDesc("osimages_propagate_copies",
			"Objects of a rule's target name in the namespaces it concerns, by state: in_sync, out_of_sync (to be created, updated or deleted), stale (kept while the source is missing), conflict (not created by osimages).",
			[]string{"rule", "state"}, nil),
		sourceDesc: prometheus.NewDesc("osimages_propagate_source_present",
			"1 when the rule's source ConfigMap exists, 0 when it is missing.",
			[]string{"rule"}, nil),
		sinceDesc: prometheus.NewDesc("osimages_propagate_seconds_since_last_sync",
			"Seconds since a copy of the rule was last found or made equal to its source. With a healthy leader this stays under the resync period; absent on replicas that never led.",
			[]string{"rule"}, nil),
		rules: rules,
		now:   time.Now,
	}
	for _, r := range rules {
		m.errors.WithLabelValues(r.Name)
		for _, a := range []Action{ActionCreate, ActionUpdate, ActionDelete, ActionMarkStale} {
			m.writes.WithLabelValues(r.Name, string(a))
		}
	}
	return m
}

func (m *collector) wrote(rule string, a Action) { m.writes.WithLabelValues(rule, string(a)).Inc() }
func (m *collector) reconcileError(rule string)  { m.errors.WithLabelValues(rule).Inc() }

func (m *collector) synced(rule string, t time.Time) {
	m.mu.Lock()
	m.lastSync[rule] = t
	m.mu.Unlock()
}

// Describe implements prometheus.Collector.
func (m *collector) Describe(ch chan<- *prometheus.Desc) {
	m.writes.Describe(ch)
	m.errors.Describe(ch)
	ch <- m.copiesDesc
	ch <- m.sourceDesc
	ch <- m.sinceDesc
}

// Collect implements prometheus.Collector.
func (m *collector) Collect(ch chan<- prometheus.Metric) {
	m.writes.Collect(ch)
	m.errors.Collect(ch)
	now := m.now()
	m.mu.Lock()
	for rule, t := range m.lastSync {
		ch <- prometheus.MustNewConstMetric(m.sinceDesc, prometheus.GaugeValue, now.Sub(t).Seconds(), rule)
	}
	m.mu.Unlock()
	if m.reader == nil || m.ready == nil || !m.ready() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, r := range m.rules {
		counts, sourcePresent, err := m.count(ctx, r, now)
		if err != nil {
			continue
		}
		present := 0.0
		if sourcePresent {
			present = 1
		}
		ch <- prometheus.MustNewConstMetric(m.sourceDesc, prometheus.GaugeValue, present, r.Name)
		for _, s := range []State{StateInSync, StateOutOfSync, StateStale, StateConflict} {
			ch <- prometheus.MustNewConstMetric(m.copiesDesc, prometheus.GaugeValue, float64(counts[s]), r.Name, string(s))
		}
	}
}

// count runs Decide over every namespace in the cache.
func (m *collector) count(ctx context.Context, r Rule, now time.Time) (map[State]int, bool, error) {
	srcFound, err := get(ctx, m.reader, types.NamespacedName{Namespace: r.Source.Namespace, Name: r.Source.Name}, &corev1.ConfigMap{})
	if err != nil {
		return nil, false, err
	}
	var nss corev1.NamespaceList
	if err := m.reader.List(ctx, &nss); err != nil {
		return nil, false, err
	}
	counts := map[State]int{}
	for i := range nss.Items {
		o, err := m.observer.observe(ctx, r, nss.Items[i].Name)
		if err != nil {
			return nil, false, err
		}
		counts[Decide(r, o, m.adopt, now).State]++
	}
	return counts, srcFound, nil
}
