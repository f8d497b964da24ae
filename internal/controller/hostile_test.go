package controller

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/sylva-projects/osimages/internal/catalog"
	"github.com/sylva-projects/osimages/internal/devregistry"
	"github.com/sylva-projects/osimages/internal/fleet"
	"github.com/sylva-projects/osimages/internal/oci"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/signature"
	"github.com/sylva-projects/osimages/internal/testenv"
)

// silentRegistry accepts connections and never answers: the registry of
// the issue that held every catalog worker for hours.
type silentRegistry struct {
	ln    net.Listener
	open  atomic.Int64
	total atomic.Int64
	mu    sync.Mutex
	conns []net.Conn
}

func newSilentRegistry(t *testing.T) *silentRegistry {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &silentRegistry{ln: ln}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.open.Add(1)
			s.total.Add(1)
			s.mu.Lock()
			s.conns = append(s.conns, c)
			s.mu.Unlock()
			// Read (and drop) what the client sends, to see it close.
			go func() {
				buf := make([]byte, 4096)
				for {
					if _, err := c.Read(buf); err != nil {
						s.open.Add(-1)
						c.Close()
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		s.mu.Lock()
		for _, c := range s.conns {
			c.Close()
		}
		s.mu.Unlock()
	})
	return s
}

func (s *silentRegistry) host() string { return s.ln.Addr().String() }

// manyImages is catalog values naming n images on host.
func manyImages(host string, n int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "oci_registry_insecure: true\nos_images_oci_registries:\n  silent: {url: 'oci://%s/dib', tag: '1.0'}\nsylva_diskimagebuilder_images:\n", host)
	for i := range n {
		fmt.Fprintf(&b, "  image-%04d: {os_images_oci_registry: silent}\n", i)
	}
	return b.String()
}

func catalogStatusOf(t testing.TB, ns string) osimage.CatalogStatus {
	cm, err := suite.Kube(t).Client.CoreV1().ConfigMaps(ns).Get(context.Background(), osimage.StatusConfigMapName, metav1.GetOptions{})
	if err != nil {
		return osimage.CatalogStatus{}
	}
	var s osimage.CatalogStatus
	_ = yaml.Unmarshal([]byte(cm.Data[osimage.CatalogStatusKey]), &s)
	return s
}

// metric returns the value of the series of name whose labels include
// want, or -1.
func metric(t *testing.T, reg *prometheus.Registry, name string, want map[string]string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	series:
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			for k, v := range want {
				if labels[k] != v {
					continue series
				}
			}
			return value(m)
		}
	}
	return -1
}

func value(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	}
	return -1
}

func published(t testing.TB, ns string) bool {
	cm, err := suite.Kube(t).Client.CoreV1().ConfigMaps(ns).Get(context.Background(), osimage.InfoConfigMapName, metav1.GetOptions{})
	return err == nil && strings.Contains(cm.Data[osimage.ValuesKey], "ubuntu")
}

// Four tenants naming 2,000 images each on a registry that accepts
// connections and never answers held every catalog worker for hours: a new
// namespace got no catalog. Their runs now hold only their share of the
// registry slots, are stopped at their budget, cancelled when their inputs
// change or go, and show in events, status and metrics; a well-behaved
// namespace is published within seconds all the same.
func TestCatalogHostileRegistries(t *testing.T) {
	good := testenv.Registry(t, devregistry.Options{})
	if _, err := good.Publish(context.Background(), devregistry.DiskImage{Repository: "dib/ubuntu", Tag: "1.0", Content: []byte("disk"), Fields: osimage.Image{"os": "ubuntu"}}); err != nil {
		t.Fatal(err)
	}
	silent := newSilentRegistry(t)
	client, err := oci.NewClient(oci.Options{Insecure: true})
	if err != nil {
		t.Fatal(err)
	}
	readRegistry := Registry{Manifests: client, Signatures: signature.Verifier{Client: client}}
	const workers, concurrency = 4, 8
	const budget = 25 * time.Second
	reg := startManager(t, Options{Workers: workers, Catalog: &CatalogOptions{
		Secure: readRegistry, Insecure: readRegistry, Concurrency: concurrency, Timeout: time.Minute, RunTimeout: budget,
	}})
	goodValues := fmt.Sprintf("oci_registry_insecure: true\nos_images_oci_registries:\n  sylva: {url: 'oci://%s/dib', tag: '1.0'}\nsylva_diskimagebuilder_images:\n  ubuntu: {os_images_oci_registry: sylva}\n", good.Host)
	latency := func(ns string) time.Duration {
		namespace(t, ns, nil)
		start := time.Now()
		put(t, ns, "inputs", map[string]string{fleet.CatalogValuesLabel: ""}, goodValues)
		testenv.Eventually(t, ns+" published", 60*time.Second, func() (bool, string) { return published(t, ns), fmt.Sprint(catalogStatusOf(t, ns)) })
		return time.Since(start)
	}
	// The same latency on a quiet controller, for comparison (the first
	// catalog of the process warms up the clients).
	latency("hostile-warmup")
	quiet := latency("hostile-baseline")

	hostile := []string{"hostile-0", "hostile-1", "hostile-2", "hostile-3"}
	started := time.Now()
	for _, ns := range hostile {
		namespace(t, ns, nil)
		put(t, ns, "inputs", map[string]string{fleet.CatalogValuesLabel: ""}, manyImages(silent.host(), 2000))
	}
	testenv.Eventually(t, "the silent registry holds every slot", 60*time.Second, func() (bool, string) {
		return silent.open.Load() >= workers*concurrency, fmt.Sprintf("%d connections open", silent.open.Load())
	})
	for _, ns := range hostile {
		if s := catalogStatusOf(t, ns); s.State != osimage.CatalogRunning {
			t.Errorf("%s: status %+v, want running", ns, s)
		}
	}

	loaded := latency("hostile-victim")
	t.Logf("catalog latency of a well-behaved namespace: %s on a quiet controller, %s while 4 namespaces hold the registry slots (%.1f×)",
		quiet.Round(time.Millisecond), loaded.Round(time.Millisecond), float64(loaded)/float64(quiet))
	if loaded > 20*time.Second {
		t.Errorf("a well-behaved namespace waited %s for its catalog behind hostile ones", loaded)
	}
	if p := metric(t, reg, "osimages_catalog_slot_preemptions_total", nil); p < 1 {
		t.Errorf("no preemption counted: %v", p)
	}
	if age := metric(t, reg, "osimages_catalog_run_seconds", map[string]string{"namespace": "hostile-2"}); age <= 0 {
		t.Errorf("osimages_catalog_run_seconds of a stuck run: %v", age)
	}

	// Changed inputs cancel the run of the old ones; gone inputs, the run.
	put(t, "hostile-0", "inputs", nil, manyImages(silent.host(), 1999))
	if err := suite.Kube(t).Client.CoreV1().ConfigMaps("hostile-1").Delete(context.Background(), "inputs", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{"hostile-0", "hostile-1"} {
		testenv.Eventually(t, ns+": run cancelled", 30*time.Second, func() (bool, string) {
			v := metric(t, reg, "osimages_catalog_runs_total", map[string]string{"namespace": ns, "result": "cancelled"})
			return v == 1, fmt.Sprint(v)
		})
	}

	// A run past its budget is stopped and reported.
	testenv.Eventually(t, "hostile-2 timed out", budget+60*time.Second, func() (bool, string) {
		s := catalogStatusOf(t, "hostile-2")
		return s.State == osimage.CatalogTimedOut && strings.Contains(s.Message, "stopped after its budget of 25s"), fmt.Sprintf("%+v after %s", s, time.Since(started))
	})
	// The event is written by the recorder's goroutine after the status.
	testenv.Eventually(t, "the timeout recorded as an event", 30*time.Second, func() (bool, string) {
		evs := eventNotes(t, "hostile-2", "CatalogTimedOut")
		return len(evs) > 0, ""
	})
	if evs := eventNotes(t, "hostile-2", "CatalogTimedOut"); !strings.Contains(evs[0], "images resolved") {
		t.Errorf("CatalogTimedOut events: %v", evs)
	}
	if v := metric(t, reg, "osimages_catalog_state", map[string]string{"namespace": "hostile-2", "state": osimage.CatalogTimedOut}); v != 1 {
		t.Errorf("osimages_catalog_state{state=timed-out} = %v", v)
	}
	if v := metric(t, reg, "osimages_catalog_runs_total", map[string]string{"namespace": "hostile-2", "result": "timeout"}); v < 1 {
		t.Errorf("osimages_catalog_runs_total{result=timeout} = %v", v)
	}

	// Once the hostile inputs are gone, no request is left hanging.
	for _, ns := range []string{"hostile-0", "hostile-2", "hostile-3"} {
		if err := suite.Kube(t).Client.CoreV1().ConfigMaps(ns).Delete(context.Background(), "inputs", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	testenv.Eventually(t, "every connection to the silent registry closed", 30*time.Second, func() (bool, string) {
		return silent.open.Load() == 0, fmt.Sprintf("%d open", silent.open.Load())
	})
}

// Hostile templates in a tenant's catalog values are refused as input
// errors, at once: three nested {{range 100000}} pinned a worker at full
// CPU with no end, and {{range 100}}{{printf "%01000000d" 0}}{{end}} took
// the controller from 65 to 969 MB.
func TestCatalogHostileTemplates(t *testing.T) {
	reg := startManager(t, Options{Catalog: &CatalogOptions{}})
	for ns, url := range map[string]string{
		"template-loops":  "oci://r/{{range 100000}}{{range 100000}}{{range 100000}}{{end}}{{end}}{{end}}",
		"template-memory": `oci://r/{{range 100}}{{printf "%01000000d" 0}}{{end}}`,
		"template-self":   "oci://r/{{ .Values.a }}",
	} {
		namespace(t, ns, nil)
		doc, _ := yaml.Marshal(map[string]any{
			"a":                        strings.Repeat("{{ .Values.a }}", 10),
			"os_images_oci_registries": map[string]any{"evil": map[string]any{"url": url, "tag": "1"}},
		})
		put(t, ns, "inputs", map[string]string{fleet.CatalogValuesLabel: ""}, string(doc))
	}
	for _, ns := range []string{"template-loops", "template-memory", "template-self"} {
		testenv.Eventually(t, ns+" refused", 30*time.Second, func() (bool, string) {
			evs := eventNotes(t, ns, "CatalogValuesInvalid")
			return len(evs) == 1 && strings.Contains(evs[0], "os_images_oci_registries.evil.url: values template refused"), fmt.Sprint(evs)
		})
		testenv.Eventually(t, ns+" status", 30*time.Second, func() (bool, string) {
			s := catalogStatusOf(t, ns)
			return s.State == osimage.CatalogRefused && strings.Contains(s.Message, "values template refused"), fmt.Sprintf("%+v", s)
		})
		if v := metric(t, reg, "osimages_catalog_state", map[string]string{"namespace": ns, "state": osimage.CatalogRefused}); v != 1 {
			t.Errorf("%s: osimages_catalog_state{state=refused} = %v", ns, v)
		}
	}
}

// A tenant's catalog values reach only the registries the management
// allows: one naming any other host:port (the apiserver's, a scan of the
// network) is refused before any connection, and the refusal says which
// registries are allowed, not what the host answered (issue 23, item 14).
func TestCatalogReachesOnlyAllowedRegistries(t *testing.T) {
	forbidden, allowed := newSilentRegistry(t), newSilentRegistry(t)
	client, err := oci.NewClient(oci.Options{Insecure: true})
	if err != nil {
		t.Fatal(err)
	}
	readRegistry := Registry{Manifests: client, Signatures: signature.Verifier{Client: client}}
	startManager(t, Options{Catalog: &CatalogOptions{Secure: readRegistry, Insecure: readRegistry, Timeout: time.Second, RunTimeout: 2 * time.Second,
		Registries: catalog.NewRegistryAllowlist("oci://" + allowed.host() + "/sylva")}})
	values := func(host string) string {
		return fmt.Sprintf("oci_registry_insecure: true\nos_images_oci_registries:\n  r: {url: 'oci://%s/dib', tag: '1.0'}\nsylva_diskimagebuilder_images:\n  img: {os_images_oci_registry: r}\n", host)
	}
	namespace(t, "scan-forbidden", nil)
	put(t, "scan-forbidden", "inputs", map[string]string{fleet.CatalogValuesLabel: ""}, values(forbidden.host()))
	namespace(t, "scan-allowed", nil)
	put(t, "scan-allowed", "inputs", map[string]string{fleet.CatalogValuesLabel: ""}, values(allowed.host()))
	// The managers of the next tests must not resolve these.
	t.Cleanup(func() {
		for _, ns := range []string{"scan-forbidden", "scan-allowed"} {
			_ = suite.Kube(t).Client.CoreV1().ConfigMaps(ns).Delete(context.Background(), "inputs", metav1.DeleteOptions{})
		}
	})

	testenv.Eventually(t, "the catalog naming a registry not allowed is refused", 30*time.Second, func() (bool, string) {
		s := catalogStatusOf(t, "scan-forbidden")
		return s.State == osimage.CatalogRefused && strings.Contains(s.Message, "is not one that workload catalogs may reach") &&
			strings.Contains(s.Message, "allowed registries: localhost:"), fmt.Sprintf("%+v", s)
	})
	testenv.Eventually(t, "the catalog of an allowed registry connects", 30*time.Second, func() (bool, string) {
		return allowed.total.Load() > 0, ""
	})
	if n := forbidden.total.Load(); n != 0 {
		t.Errorf("%d connections to a registry the management does not allow", n)
	}
	// Events are written by the recorder's goroutine after the status:
	// wait for the first, then it must be the only one.
	testenv.Eventually(t, "the refusal recorded as an event", 30*time.Second, func() (bool, string) {
		evs := eventNotes(t, "scan-forbidden", "CatalogRegistryNotAllowed")
		return len(evs) > 0, fmt.Sprint(evs)
	})
	if evs := eventNotes(t, "scan-forbidden", "CatalogRegistryNotAllowed"); len(evs) != 1 {
		t.Errorf("events: %v, want the refusal recorded once", evs)
	}
}
