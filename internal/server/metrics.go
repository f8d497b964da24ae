package server

import (
	"io"
	"net/http"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/sylva-projects/osimages/internal/serverio"
)

// Metrics are the server's Prometheus metrics, on a registry of their own.
type Metrics struct {
	registry        *prometheus.Registry
	requests        *prometheus.CounterVec
	bytesServed     prometheus.Counter
	inFlight        prometheus.Gauge
	bytesDownloaded prometheus.Counter
	verifyFailures  prometheus.Counter
	peerFailures    *prometheus.CounterVec
	scrubBytes      prometheus.Counter
	scrubFailures   prometheus.Counter
	keptBytes       prometheus.Counter
	keptDiscarded   prometheus.Counter
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
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "osimages_downloads_in_flight", Help: "Image downloads in progress.",
		}),
		bytesDownloaded: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "osimages_downloaded_bytes_total", Help: "Bytes received from registries and HTTP sources.",
		}),
		verifyFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "osimages_verification_failures_total", Help: "Downloads refused because a digest or size did not match.",
		}),
		peerFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "osimages_peer_fill_failures_total", Help: "Fills from a peer replica that failed (reason failed), sent below --min-rate (reason slow) or brought bytes that did not verify (reason bad-bytes), by peer; the image was then filled from elsewhere.",
		}, []string{"peer", "reason"}),
		scrubBytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "osimages_scrub_read_bytes_total", Help: "Bytes of stored images re-read and re-hashed by the scrub.",
		}),
		scrubFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "osimages_scrub_failures_total", Help: "Stored images the scrub found changed (sha256 or size): each was dropped and downloaded again.",
		}),
		keptBytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "osimages_download_kept_bytes_total", Help: "Bytes of partial downloads kept from an earlier attempt or process, checked, and continued from rather than downloaded again.",
		}),
		keptDiscarded: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "osimages_download_kept_discarded_total", Help: "Partial downloads kept from an earlier attempt or process that no longer matched their checkpoint (damaged while the server was down): each was downloaded again from byte 0.",
		}),
	}
	m.registry.MustRegister(m.requests, m.bytesServed, m.inFlight, m.bytesDownloaded, m.verifyFailures, m.peerFailures, m.scrubBytes, m.scrubFailures, m.keptBytes, m.keptDiscarded,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Registry is where more collectors of the process can be registered.
func (m *Metrics) Registry() *prometheus.Registry { return m.registry }

// bind adds the metrics computed from the server's state at scrape time.
func (m *Metrics) bind(s *Server) {
	m.registry.MustRegister(newFleetNeedsCollector(s))
	images := prometheus.NewDesc("osimages_images", "Known images by phase; selected is false for deselected images kept on disk.", []string{"phase", "selected"}, nil)
	free := prometheus.NewDesc("osimages_disk_free_bytes", "Free bytes on the data filesystem.", nil, nil)
	used := prometheus.NewDesc("osimages_storage_used_bytes", "Bytes of stored images.", nil, nil)
	kept := prometheus.NewDesc("osimages_images_kept_referenced", "Deselected images kept and served because Metal3 objects still reference them (kept: still referenced by NS/NAME), by number of referencing objects.", []string{"sha256", "key", "referenced_by"}, nil)
	refused := prometheus.NewDesc("osimages_inputs_refused", "1 while the newest inputs read are refused (the last good ones stay in force), by reason: unreadable, near-miss, empty, too-large.", []string{"reason"}, nil)
	refusals := prometheus.NewDesc("osimages_inputs_refusals_total", "Inputs refused since the start, by reason (each refusal counts once, not at every poll).", []string{"reason"}, nil)
	accepted := prometheus.NewDesc("osimages_inputs_accepted_timestamp_seconds", "When the inputs read were last found good (Unix time).", nil, nil)
	collected := prometheus.NewDesc("osimages_gc_last_pass_timestamp_seconds", "When the last complete garbage-collection pass began (Unix time); passes postponed until the desired set and every Metal3 reference are known do not count.", nil, nil)
	m.registry.MustRegister(collectorFunc{descs: []*prometheus.Desc{collected}, collect: func(ch chan<- prometheus.Metric) {
		if at := s.LastCollection(); !at.IsZero() {
			ch <- prometheus.MustNewConstMetric(collected, prometheus.GaugeValue, float64(at.UnixNano())/1e9)
		}
	}})
	scrubbed := prometheus.NewDesc("osimages_scrub_last_pass_timestamp_seconds", "When the scrub last found every stored image re-hashed (or verified) within --scrub-interval (Unix time); absent while the scrub is off or has not caught up since the start.", nil, nil)
	m.registry.MustRegister(collectorFunc{descs: []*prometheus.Desc{scrubbed}, collect: func(ch chan<- prometheus.Metric) {
		if at := s.ScrubStatus().UpToDate; !at.IsZero() {
			ch <- prometheus.MustNewConstMetric(scrubbed, prometheus.GaugeValue, float64(at.UnixNano())/1e9)
		}
	}})
	m.registry.MustRegister(collectorFunc{descs: []*prometheus.Desc{refused, refusals, accepted}, collect: func(ch chan<- prometheus.Metric) {
		st := s.InputsStatus()
		for _, r := range serverio.Refusals {
			v := 0.0
			if st.Refused != nil && st.Refused.Reason == r {
				v = 1
			}
			ch <- prometheus.MustNewConstMetric(refused, prometheus.GaugeValue, v, string(r))
			ch <- prometheus.MustNewConstMetric(refusals, prometheus.CounterValue, float64(st.Refusals[r]), string(r))
		}
		if !st.Accepted.IsZero() {
			ch <- prometheus.MustNewConstMetric(accepted, prometheus.GaugeValue, float64(st.Accepted.UnixNano())/1e9)
		}
	}})
	m.registry.MustRegister(collectorFunc{descs: []*prometheus.Desc{images, free, used, kept}, collect: func(ch chan<- prometheus.Metric) {
		counts := map[[2]string]int{}
		for _, p := range []Phase{PhaseQueued, PhaseDownloading, PhaseVerifying, PhaseReady, PhaseFailed} {
			counts[[2]string{string(p), "true"}] = 0
		}
		statuses, _ := s.Statuses()
		for _, st := range statuses {
			counts[[2]string{string(st.Phase), strconv.FormatBool(st.Selected)}]++
			if len(st.KeptBy) > 0 {
				// The first referrer names one culprit in the label; the
				// value counts them all.
				ch <- prometheus.MustNewConstMetric(kept, prometheus.GaugeValue, float64(len(st.KeptBy)), string(st.SHA256), st.Key, st.KeptBy[0])
			}
		}
		for k, n := range counts {
			ch <- prometheus.MustNewConstMetric(images, prometheus.GaugeValue, float64(n), k[0], k[1])
		}
		if avail, err := s.cfg.Store.Available(); err == nil {
			ch <- prometheus.MustNewConstMetric(free, prometheus.GaugeValue, float64(avail))
		}
		ch <- prometheus.MustNewConstMetric(used, prometheus.GaugeValue, float64(s.cfg.Store.Used()))
	}})
	m.bindPhase(s)
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
