package imagehttp

import (
	"io"
	"net/http"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/sylva-projects/osimages/internal/imagelife"
	"github.com/sylva-projects/osimages/internal/serverio"
)

// Metrics are the server's Prometheus metrics, on a registry of their own:
// the counters the server adds to (exported), those of the HTTP requests,
// and the gauges read from a Report at scrape time (Bind).
type Metrics struct {
	registry        *prometheus.Registry
	requests        *prometheus.CounterVec
	bytesServed     prometheus.Counter
	InFlight        prometheus.Gauge
	BytesDownloaded prometheus.Counter
	VerifyFailures  prometheus.Counter
	PeerFailures    *prometheus.CounterVec
	ScrubBytes      prometheus.Counter
	ScrubFailures   prometheus.Counter
	KeptBytes       prometheus.Counter
	KeptDiscarded   prometheus.Counter
}

// NewMetrics registers the server's metrics, and the Go and process
// collectors, on a new registry.
func NewMetrics() *Metrics {
	m := &Metrics{
		registry: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "osimages_http_requests_total", Help: "HTTP requests answered, by status code.",
		}, []string{"code"}),
		bytesServed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "osimages_http_served_bytes_total", Help: "Bytes of image files sent to clients.",
		}),
		InFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "osimages_downloads_in_flight", Help: "Image downloads in progress.",
		}),
		BytesDownloaded: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "osimages_downloaded_bytes_total", Help: "Bytes received from registries and HTTP sources.",
		}),
		VerifyFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "osimages_verification_failures_total", Help: "Downloads refused because a digest or size did not match.",
		}),
		PeerFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "osimages_peer_fill_failures_total", Help: "Fills from a peer replica that failed (reason failed), sent below --min-rate (reason slow) or brought bytes that did not verify (reason bad-bytes), by peer; the image was then filled from elsewhere.",
		}, []string{"peer", "reason"}),
		ScrubBytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "osimages_scrub_read_bytes_total", Help: "Bytes of stored images re-read and re-hashed by the scrub.",
		}),
		ScrubFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "osimages_scrub_failures_total", Help: "Stored images the scrub found changed (sha256 or size): each was dropped and downloaded again.",
		}),
		KeptBytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "osimages_download_kept_bytes_total", Help: "Bytes of partial downloads kept from an earlier attempt or process, checked, and continued from rather than downloaded again.",
		}),
		KeptDiscarded: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "osimages_download_kept_discarded_total", Help: "Partial downloads kept from an earlier attempt or process that no longer matched their checkpoint (damaged while the server was down): each was downloaded again from byte 0.",
		}),
	}
	m.registry.MustRegister(m.requests, m.bytesServed, m.InFlight, m.BytesDownloaded, m.VerifyFailures, m.PeerFailures, m.ScrubBytes, m.ScrubFailures, m.KeptBytes, m.KeptDiscarded,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Registry is where more collectors of the process can be registered.
func (m *Metrics) Registry() *prometheus.Registry { return m.registry }

// Bind adds the metrics computed from the server's state at scrape time;
// report is called once per scrape.
func (m *Metrics) Bind(report func() Report) {
	images := prometheus.NewDesc("osimages_images", "Known images by phase; selected is false for deselected images kept on disk.", []string{"phase", "selected"}, nil)
	free := prometheus.NewDesc("osimages_disk_free_bytes", "Free bytes on the data filesystem.", nil, nil)
	used := prometheus.NewDesc("osimages_storage_used_bytes", "Bytes of stored images.", nil, nil)
	kept := prometheus.NewDesc("osimages_images_kept_referenced", "Deselected images kept and served because Metal3 objects still reference them (kept: still referenced by NS/NAME), by number of referencing objects.", []string{"sha256", "key", "referenced_by"}, nil)
	refused := prometheus.NewDesc("osimages_inputs_refused", "1 while the newest inputs read are refused (the last good ones stay in force), by reason: unreadable, near-miss, empty, too-large.", []string{"reason"}, nil)
	refusals := prometheus.NewDesc("osimages_inputs_refusals_total", "Inputs refused since the start, by reason (each refusal counts once, not at every poll).", []string{"reason"}, nil)
	accepted := prometheus.NewDesc("osimages_inputs_accepted_timestamp_seconds", "When the inputs read were last found good (Unix time).", nil, nil)
	collected := prometheus.NewDesc("osimages_gc_last_pass_timestamp_seconds", "When the last complete garbage-collection pass began (Unix time); passes postponed until the desired set and every Metal3 reference are known do not count.", nil, nil)
	scrubbed := prometheus.NewDesc("osimages_scrub_last_pass_timestamp_seconds", "When the scrub last found every stored image re-hashed (or verified) within --scrub-interval (Unix time); absent while the scrub is off or has not caught up since the start.", nil, nil)
	phase := prometheus.NewDesc("osimages_server_phase", "The image server's phase (starting, waiting-for-catalog, serving): 1 for the current one.", []string{"phase"}, nil)
	needs := prometheus.NewDesc("osimages_fleet_needs_refused",
		"Images some workload namespace needs that the image server refuses to serve (--serve-fleet-needs), by namespace and reason: registry-not-allowed, uri-not-allowed, quota-images, quota-bytes, no-record, invalid.",
		[]string{"namespace", "reason"}, nil)
	m.registry.MustRegister(collectorFunc{descs: []*prometheus.Desc{images, free, used, kept, refused, refusals, accepted, collected, scrubbed, phase, needs}, collect: func(ch chan<- prometheus.Metric) {
		r := report()
		gauge := func(d *prometheus.Desc, v float64, labels ...string) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
		}
		if at := r.LastCollection; !at.IsZero() {
			gauge(collected, float64(at.UnixNano())/1e9)
		}
		if at := r.Scrub.UpToDate; !at.IsZero() {
			gauge(scrubbed, float64(at.UnixNano())/1e9)
		}
		for _, reason := range serverio.Refusals {
			v := 0.0
			if r.Inputs.Refused != nil && r.Inputs.Refused.Reason == reason {
				v = 1
			}
			gauge(refused, v, string(reason))
			ch <- prometheus.MustNewConstMetric(refusals, prometheus.CounterValue, float64(r.Inputs.Refusals[reason]), string(reason))
		}
		if !r.Inputs.Accepted.IsZero() {
			gauge(accepted, float64(r.Inputs.Accepted.UnixNano())/1e9)
		}
		counts := map[[2]string]int{}
		for _, p := range []imagelife.Phase{imagelife.PhaseQueued, imagelife.PhaseDownloading, imagelife.PhaseVerifying, imagelife.PhaseReady, imagelife.PhaseFailed} {
			counts[[2]string{string(p), "true"}] = 0
		}
		for _, st := range r.Images {
			counts[[2]string{string(st.Phase), strconv.FormatBool(st.Selected)}]++
			if len(st.KeptBy) > 0 {
				// The first referrer names one culprit in the label; the
				// value counts them all.
				gauge(kept, float64(len(st.KeptBy)), string(st.SHA256), st.Key, st.KeptBy[0])
			}
		}
		for k, n := range counts {
			gauge(images, float64(n), k[0], k[1])
		}
		if r.FreeErr == nil {
			gauge(free, float64(r.Free))
		}
		gauge(used, float64(r.Used))
		// 1 for the current phase, 0 for the others, so that an alert can
		// ask how long it has been waiting.
		for _, p := range serverPhases {
			v := 0.0
			if p == r.Phase {
				v = 1
			}
			gauge(phase, v, string(p))
		}
		type nsReason struct{ ns, reason string }
		refusedNeeds := map[nsReason]int{}
		for _, n := range r.RefusedNeeds {
			refusedNeeds[nsReason{n.Namespace, n.Reason}]++
		}
		for k, n := range refusedNeeds {
			gauge(needs, float64(n), k.ns, k.reason)
		}
	}})
}

type collectorFunc struct {
	descs   []*prometheus.Desc
	collect func(chan<- prometheus.Metric)
}

func (c collectorFunc) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

func (c collectorFunc) Collect(ch chan<- prometheus.Metric) { c.collect(ch) }

// instrument counts responses by code and the bytes of image files sent.
func (m *Metrics) instrument(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cw := &countingWriter{ResponseWriter: w, code: http.StatusOK}
		next.ServeHTTP(cw, r)
		m.requests.WithLabelValues(strconv.Itoa(cw.code)).Inc()
		if isImagePath(r.URL.EscapedPath()) {
			m.bytesServed.Add(float64(cw.bytes))
		}
	})
}

// countingWriter records the status and body bytes of a response. It keeps
// io.ReaderFrom, through which net/http sends an *os.File with sendfile:
// hiding it would copy every image through user space.
type countingWriter struct {
	http.ResponseWriter
	code  int
	bytes int64
}

func (w *countingWriter) WriteHeader(code int) {
	w.code = code
	w.ResponseWriter.WriteHeader(code)
}

func (w *countingWriter) Write(p []byte) (int, error) {
	n, err := w.ResponseWriter.Write(p)
	w.bytes += int64(n)
	return n, err
}

func (w *countingWriter) ReadFrom(r io.Reader) (int64, error) {
	var n int64
	var err error
	if rf, ok := w.ResponseWriter.(io.ReaderFrom); ok {
		n, err = rf.ReadFrom(r)
	} else {
		// HTTP/2 (TLS) has no sendfile path to keep.
		n, err = io.Copy(struct{ io.Writer }{w.ResponseWriter}, r)
	}
	w.bytes += n
	return n, err
}

func (w *countingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
