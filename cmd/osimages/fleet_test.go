package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/sylva-projects/osimages/internal/devregistry"
	"github.com/sylva-projects/osimages/internal/fleet"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/testenv"
)

// The fleet scenarios run the whole chain as an operator does: the real
// apiserver, a real registry, `osimages serve` and `osimages controller`
// as processes, and `osimages render --apply`. Each scenario starts a
// chain of its own (newFleet), with namespaces, a workload label and
// image contents of its own, so that it runs alone (-run) and shares the
// apiserver with the other tests without meeting their objects.
const (
	fleetServedCM = "capm3-os-image-server-os-images"
	fleetCopy     = "kyverno-cloned-os-image-server-images"
	img132        = "ubuntu-noble-plain-rke2-1-32"
	img131        = "ubuntu-noble-plain-rke2-1-31"
)

var templatesGVR = schema.GroupVersionResource{Group: "infrastructure.cluster.x-k8s.io", Version: "v1beta2", Resource: "metal3machinetemplates"}

// gate holds the downloads of some blobs until released, so that an image
// stays "downloading" for as long as a scenario needs.
type gate struct {
	mu      sync.Mutex
	blocked map[string]chan struct{}
	// blobs counts the blob GETs per /v2/ path before /blobs/.
	blobs map[string]int
}

// blobGets is how many blobs were downloaded from the repositories whose
// names start with prefix.
func (g *gate) blobGets(prefix string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	n := 0
	for repo, c := range g.blobs {
		if strings.HasPrefix(repo, prefix) {
			n += c
		}
	}
	return n
}

func (g *gate) hold(digest string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.blocked[digest] = make(chan struct{})
}

func (g *gate) release(digest string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if ch, ok := g.blocked[digest]; ok {
		close(ch)
		delete(g.blocked, digest)
	}
}

func (g *gate) middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		g.mu.Lock()
		if repo, _, ok := strings.Cut(strings.TrimPrefix(r.URL.Path, "/v2/"), "/blobs/"); ok && r.Method == http.MethodGet {
			if g.blobs == nil {
				g.blobs = map[string]int{}
			}
			g.blobs[repo]++
		}
		var wait chan struct{}
		for d, ch := range g.blocked {
			if strings.HasSuffix(r.URL.Path, "/blobs/"+d) {
				wait = ch
			}
		}
		g.mu.Unlock()
		if wait != nil {
			select {
			case <-wait:
			case <-r.Context().Done():
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// fleetEnv is the running chain of one scenario.
type fleetEnv struct {
	t         *testing.T
	k         *testenv.Kube
	dyn       dynamic.Interface
	reg       *devregistry.Registry
	gate      *gate
	published map[string]devregistry.Published // "name:tag"
	serve     *serveProcess
	ctrl      *serveProcess
	// metricsAddr is the controller's metrics endpoint.
	metricsAddr string
	mgmtFile    string
	extra       map[string]string // hand-declared mgmt keys -> name:tag

	// mgmtNS is the management namespace, label the label of the
	// workload namespaces wc1, wc2 and wc3.
	mgmtNS, label, wc1, wc2, wc3 string
	// By workload namespace: its cluster values, the diskimage-builder
	// version it pins and the image it picks.
	clusters, versions, images map[string]string
	// initial are the templates newFleet rendered.
	initial map[string]string
}

func (e *fleetEnv) workloads() []string { return []string{e.wc1, e.wc2, e.wc3} }

func (e *fleetEnv) publish(name, tag string, seed uint64) devregistry.Published {
	e.t.Helper()
	k8s := "1.32.5+rke2r1"
	if name == img131 {
		k8s = "1.31.9+rke2r1"
	}
	p, err := e.reg.Publish(context.Background(), devregistry.DiskImage{
		Repository: dibRepo + name, Tag: tag, Gzip: true,
		Content: devregistry.DiskContent(256<<10, seed),
		Fields: osimage.Image{"os": "ubuntu", "os-release": "noble", "hardened": "false", "flavor": "plain",
			"k8s-flavor": "rke2", "k8s-version": k8s, "commit-tag": tag},
	})
	if err != nil {
		e.t.Fatal(err)
	}
	e.published[name+":"+tag] = p
	return p
}

func (e *fleetEnv) sha(nameTag string) osimage.SHA256 {
	return imageSHA(e.t, e.published[nameTag])
}

// catalogInputs are sylva-units values: one registry at one
// diskimage-builder version, and both images.
func (e *fleetEnv) catalogInputs(version string) string {
	return fmt.Sprintf(`sylva_base_oci_registry: oci://%s/sylva-projects
sylva_diskimagebuilder_version: %s
oci_registry_insecure: true
os_images_oci_registries:
  sylva:
    url: '{{ .Values.sylva_base_oci_registry }}/sylva-elements/diskimage-builder'
    tag: '{{ .Values.sylva_diskimagebuilder_version }}'
sylva_diskimagebuilder_images:
  %s: {os_images_oci_registry: sylva}
  %s: {os_images_oci_registry: sylva}
`, e.reg.Host, version, img132, img131)
}

// mgmtValues are the management cluster's values: its catalog inputs, its
// own cluster (k8s 1.32, picking from its own registry key only), and one
// hand-declared image plus one additional selector per workload image it
// serves on top.
func (e *fleetEnv) mgmtValues(version string) string {
	var b strings.Builder
	b.WriteString(e.catalogInputs(version))
	b.WriteString(`name: mgmt
k8s_version: v1.32.5+rke2r1
capi_providers: {infra_provider: capm3, bootstrap_provider: cabpr}
os_image_selector_autoselect_registries: sylva
capm3:
  os_image_selector: {os: ubuntu}
`)
	keys := slices.Sorted(func(yield func(string) bool) {
		for k := range e.extra {
			if !yield(k) {
				return
			}
		}
	})
	if len(keys) > 0 {
		b.WriteString("os_images:\n")
		for _, k := range keys {
			fmt.Fprintf(&b, "  %s: {uri: 'oci://%s'}\n", k, e.published[e.extra[k]].Ref)
		}
		b.WriteString("os_image_server_additional_selectors:\n")
		for _, k := range keys {
			fmt.Fprintf(&b, "  %s: {_os_images_key_: %s}\n", k, k)
		}
	}
	return b.String()
}

func (e *fleetEnv) clusterValues(name, k8s string) string {
	host := e.serve.addr
	return fmt.Sprintf(`name: %s
k8s_version: %s
capi_providers: {infra_provider: capm3, bootstrap_provider: cabpr}
capm3:
  os_image_selector: {os: ubuntu}
  image_provisioning_host: %s
  image_provisioning_scheme: http
machine_deployments:
  md0:
    capm3: {nodeReuse: true}
`, name, k8s, host)
}

func (e *fleetEnv) applyConfigMap(ns, name string, labels map[string]string, doc string) {
	e.t.Helper()
	ctx := context.Background()
	cms := e.k.Client.CoreV1().ConfigMaps(ns)
	cm, err := cms.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		cm = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels}, Data: map[string]string{"values.yaml": doc}}
		_, err = cms.Create(ctx, cm, metav1.CreateOptions{})
	} else if err == nil {
		cm.Data = map[string]string{"values.yaml": doc}
		_, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
	}
	if err != nil {
		e.t.Fatal(err)
	}
}

func (e *fleetEnv) setMgmt(version string) {
	e.t.Helper()
	doc := e.mgmtValues(version)
	e.applyConfigMap(e.mgmtNS, "mgmt-values", map[string]string{fleet.CatalogValuesLabel: ""}, doc)
	if err := os.WriteFile(e.mgmtFile, []byte(doc), 0o600); err != nil {
		e.t.Fatal(err)
	}
}

func (e *fleetEnv) configMapDoc(ns, name string) string {
	cm, err := e.k.Client.CoreV1().ConfigMaps(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		return ""
	}
	return cm.Data["values.yaml"]
}

func (e *fleetEnv) catalogOf(ns string) osimage.Catalog {
	c, _ := osimage.ParseInfo([]byte(e.configMapDoc(ns, osimage.InfoConfigMapName)))
	return c
}

func (e *fleetEnv) servedIn(ns, name string) osimage.ServedSet {
	s, _ := osimage.ParseServed([]byte(e.configMapDoc(ns, name)))
	return s
}

func (e *fleetEnv) waitCatalog(ns, key string, sha osimage.SHA256) {
	e.t.Helper()
	testenv.Eventually(e.t, "os-images-info of "+ns+" with "+key+" at "+sha.String()[:12], 60*time.Second, func() (bool, string) {
		c := e.catalogOf(ns)
		return c[key][osimage.FieldSHA256] == sha.String(), fmt.Sprint(c[key])
	})
}

// waitCopy waits until the served set reached namespace ns with sha in
// the given availability.
func (e *fleetEnv) waitCopy(ns string, sha osimage.SHA256, present, available bool) {
	e.t.Helper()
	testenv.Eventually(e.t, fmt.Sprintf("served copy in %s: %s present=%v available=%v", ns, sha[:12], present, available), 60*time.Second, func() (bool, string) {
		s := e.servedIn(ns, fleetCopy)
		entry, ok := s[sha]
		return ok == present && (!present || entry.Available == available), fmt.Sprint(s)
	})
}

func (e *fleetEnv) status(ns string) osimage.CheckReport {
	cm, err := e.k.Client.CoreV1().ConfigMaps(ns).Get(context.Background(), osimage.StatusConfigMapName, metav1.GetOptions{})
	if err != nil {
		return osimage.CheckReport{}
	}
	r, _ := osimage.ParseCheckReport(cm.Data[osimage.StatusKey])
	return r
}

func (e *fleetEnv) render(ns string, values string) result {
	e.t.Helper()
	f := writeFile(e.t, ns+".yaml", values)
	// v1beta2 is the storage version: without CAPM3's conversion webhook
	// (not deployed in envtest) the apiserver prunes v1beta1's format, and
	// every re-apply of a v1beta1 template would be a write.
	return run(e.t, "render", "-f", f, "--kubeconfig", e.k.Kubeconfig, "-n", ns, "--apply", "--api-version", "v1beta2",
		"--os-images-configmap", ns+"/"+osimage.InfoConfigMapName, "--served-configmap", ns+"/"+fleetCopy)
}

// templates returns every Metal3MachineTemplate of the fleet, by NS/NAME,
// as the apiserver holds it (resourceVersion included: an unchanged object
// keeps it).
func (e *fleetEnv) templates() map[string]string {
	e.t.Helper()
	out := map[string]string{}
	for _, ns := range e.workloads() {
		list, err := e.dyn.Resource(templatesGVR).Namespace(ns).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			e.t.Fatal(err)
		}
		for _, item := range list.Items {
			data, _ := json.Marshal(item.Object)
			out[ns+"/"+item.GetName()] = string(data)
		}
	}
	return out
}

func namesIn(m map[string]string, ns string) []string {
	var out []string
	for k := range m {
		if strings.HasPrefix(k, ns+"/") {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

func (e *fleetEnv) namespaceEvents(ns, reason string) []string {
	list, err := e.k.Client.EventsV1().Events(ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		return nil
	}
	var out []string
	for _, ev := range list.Items {
		if ev.Reason == reason && ev.Related != nil && ev.Related.Kind == "Namespace" && ev.Related.Name == ns {
			out = append(out, ev.Note)
		}
	}
	return out
}

// newFleet starts the chain of one scenario, named name (a DNS label
// prefix): a registry with every version of both images (contents drawn
// from seed, so that no other scenario's objects reference them), the
// management namespace and three workload clusters pinning different
// diskimage-builder versions, `osimages serve` and `osimages controller`,
// and each cluster rendered and checked all served. wc1 (0.7.5) and wc3
// (0.7.7) run Kubernetes 1.32, wc2 (0.7.6) 1.31; the management cluster
// is at 0.7.7 and serves each of their images on top of its own, plus
// the extra keys given (key -> name:tag).
func newFleet(t *testing.T, name string, seed uint64, extra map[string]string) *fleetEnv {
	t.Helper()
	return newFleetWith(t, name, seed, extra, fleetArgs{})
}

// fleetArgs are more arguments for the chain's processes.
type fleetArgs struct {
	serve, ctrl []string
}

// newFleetWith is newFleet, with more arguments for serve and controller.
func newFleetWith(t *testing.T, name string, seed uint64, extra map[string]string, more fleetArgs) *fleetEnv {
	t.Helper()
	k := apiserver(t)
	dyn, err := dynamic.NewForConfig(k.Config)
	if err != nil {
		t.Fatal(err)
	}
	g := &gate{blocked: map[string]chan struct{}{}}
	e := &fleetEnv{t: t, k: k, dyn: dyn, gate: g, reg: testenv.Registry(t, devregistry.Options{Middleware: g.middleware}),
		published: map[string]devregistry.Published{}, mgmtFile: writeFile(t, "mgmt.yaml", ""),
		mgmtNS: name + "-mgmt", label: "osimages-e2e/" + name, wc1: name + "-wc1", wc2: name + "-wc2", wc3: name + "-wc3"}
	// Each version's files differ; the file names stay the same.
	for i, v := range []string{"0.7.5", "0.7.6", "0.7.7", "0.7.8", "0.7.9"} {
		e.publish(img132, v, seed+uint64(10+i))
		e.publish(img131, v, seed+uint64(20+i))
	}
	k.Namespace(t, e.mgmtNS, nil)
	for _, ns := range e.workloads() {
		k.Namespace(t, ns, map[string]string{e.label: ""})
	}

	e.extra = map[string]string{"wc1-ubuntu": img132 + ":0.7.5", "wc2-ubuntu": img131 + ":0.7.6", "wc3-ubuntu": img132 + ":0.7.7"}
	for key, nameTag := range extra {
		e.extra[key] = nameTag
	}
	e.setMgmt("0.7.7")

	e.serve = startServe(t, freeAddr(t), append([]string{"--data", t.TempDir(), "--kubeconfig", k.Kubeconfig, "-f", e.mgmtFile,
		"--os-images-configmap", e.mgmtNS + "/" + osimage.InfoConfigMapName,
		"--output-configmap", e.mgmtNS + "/" + fleetServedCM, "--gc-grace", "1s"}, more.serve...)...)
	rules := writeFile(t, "rules.yaml", fmt.Sprintf(`rules:
- name: fleet
  source: %s/%s
  target: %s
  namespaceSelector: {matchLabels: {%s: ""}}
`, e.mgmtNS, fleetServedCM, fleetCopy, e.label))
	e.metricsAddr = freeAddr(t)
	// Which registries tenants' catalogs may reach is the subject of
	// TestControllerNeedsToKnowWhichRegistriesCatalogsMayReach and of the
	// controller's own tests; here, any.
	e.ctrl = startDaemon(t, append([]string{"controller", "--kubeconfig", k.Kubeconfig, "--config", rules, "--catalog-allow-any-registry",
		"--check-namespace-selector", e.label, "--metrics-addr", e.metricsAddr, "--health-addr", "0", "--log-format", "text"}, more.ctrl...)...)

	e.clusters = map[string]string{
		e.wc1: e.clusterValues(e.wc1, "v1.32.5+rke2r1"),
		e.wc2: e.clusterValues(e.wc2, "v1.31.9+rke2r1"),
		e.wc3: e.clusterValues(e.wc3, "v1.32.5+rke2r1"),
	}
	e.versions = map[string]string{e.wc1: "0.7.5", e.wc2: "0.7.6", e.wc3: "0.7.7"}
	e.images = map[string]string{e.wc1: img132, e.wc2: img131, e.wc3: img132}
	for _, ns := range e.workloads() {
		e.applyConfigMap(ns, "catalog", map[string]string{fleet.CatalogValuesLabel: ""}, e.catalogInputs(e.versions[ns]))
		e.applyConfigMap(ns, "cluster", map[string]string{fleet.ClusterValuesLabel: ""}, e.clusters[ns])
	}
	for _, ns := range e.workloads() {
		sha := e.sha(e.images[ns] + ":" + e.versions[ns])
		e.waitCatalog(ns, e.images[ns], sha)
		e.waitCopy(ns, sha, true, true)
		if r := e.render(ns, e.clusters[ns]); r.code != 0 {
			t.Fatalf("render %s: exit %d\n%s\nserve:\n%s\ncontroller:\n%s", ns, r.code, r.stderr, e.serve.stderr, e.ctrl.stderr)
		}
	}
	e.initial = e.templates()
	for _, ns := range e.workloads() {
		if n := len(namesIn(e.initial, ns)); n != 2 {
			t.Fatalf("%s: want 2 templates (cp, md0), got %v", ns, namesIn(e.initial, ns))
		}
	}
	testenv.Eventually(t, "every check reports all served", 30*time.Second, func() (bool, string) {
		for _, ns := range e.workloads() {
			r := e.status(ns)
			if len(r.Images) != 1 || len(r.Problems()) != 0 {
				return false, fmt.Sprintf("%s: %+v", ns, r)
			}
		}
		return true, ""
	})
	return e
}

// TestFleetEndToEnd runs each scenario on a chain of its own: any one
// runs alone with -run 'TestFleetEndToEnd/NAME'.
func TestFleetEndToEnd(t *testing.T) {
	t.Run("same filename, two versions, two URLs", func(t *testing.T) {
		e := newFleet(t, "fleet-urls", 100, nil)
		a, b := e.published[img132+":0.7.5"], e.published[img132+":0.7.7"]
		if a.Fields[osimage.FieldFilename] != b.Fields[osimage.FieldFilename] || e.sha(img132+":0.7.5") == e.sha(img132+":0.7.7") {
			t.Fatal("the fixture must give one filename two contents")
		}
		for _, p := range []devregistry.Published{a, b} {
			want := p.Fields.Get(osimage.FieldSHA256)
			got, code := sha256Of(t, e.serve.url("/images/"+want+"/"+p.Fields.Get(osimage.FieldFilename)))
			if code != 200 || got != want {
				t.Errorf("%s: HTTP %d, content sha256 %s", p.Ref, code, got)
			}
		}
	})

	t.Run("management bumps its diskimage-builder version: zero rolling updates", func(t *testing.T) {
		e := newFleet(t, "fleet-mgmt-bump", 200, nil)
		e.setMgmt("0.7.8")
		newMgmt := e.sha(img132 + ":0.7.8")
		e.waitCatalog(e.mgmtNS, img132, newMgmt)
		for _, ns := range e.workloads() {
			e.waitCopy(ns, newMgmt, true, true)
		}
		// The operator re-renders every cluster, as a Helm upgrade does.
		for _, ns := range e.workloads() {
			if r := e.render(ns, e.clusters[ns]); r.code != 0 {
				t.Fatalf("render %s after the management bump: exit %d\n%s", ns, r.code, r.stderr)
			}
		}
		if after := e.templates(); !mapsEqual(after, e.initial) {
			t.Fatalf("a management-side change touched workload templates:%s", diffMaps(e.initial, after))
		}
	})

	t.Run("management stops serving an image a workload cluster uses", func(t *testing.T) {
		// witness is an image no object references, deselected together
		// with wc1's: its deletion shows that garbage collection ran past
		// the grace period over both.
		e := newFleet(t, "fleet-unserved", 300, map[string]string{"witness": img131 + ":0.7.9"})
		ctx := context.Background()
		witness := e.published[img131+":0.7.9"]
		// Stored before it is deselected, so that it has a file to collect.
		e.waitCopy(e.wc1, imageSHA(t, witness), true, true)
		sha := e.sha(img132 + ":0.7.5")
		filename := e.published[img132+":0.7.5"].Fields.Get(osimage.FieldFilename)
		delete(e.extra, "wc1-ubuntu")
		delete(e.extra, "witness")
		proposed := writeFile(t, "proposed.yaml", e.mgmtValues("0.7.8"))

		// plan predicts it.
		r := run(t, "plan", "-f", proposed, "--kubeconfig", e.k.Kubeconfig, "--served-configmap", e.mgmtNS+"/"+fleetServedCM, "--namespace-selector", e.label)
		if r.code != 1 {
			t.Fatalf("plan: want exit 1, got %d\n%s\n%s", r.code, r.stdout, r.stderr)
		}
		verdicts := map[string]string{}
		for _, line := range strings.Split(strings.TrimSpace(r.stdout), "\n")[1:] {
			ns, verdict, _ := strings.Cut(line, " ")
			verdicts[ns] += strings.TrimSpace(verdict)
		}
		if v := verdicts[e.wc1]; !strings.HasPrefix(v, "would fail: "+sha.String()+"/"+img132+" no longer served") {
			t.Errorf("plan does not predict wc1's failure: %q\n%s\n%s", v, r.stdout, r.stderr)
		}
		for _, ns := range []string{e.wc2, e.wc3} {
			if verdicts[ns] != "unchanged" {
				t.Errorf("plan: %s should be unchanged, got %q", ns, verdicts[ns])
			}
		}

		e.setMgmt("0.7.8")
		start := time.Now()
		testenv.Eventually(t, "the live check reports wc1's image not served", 30*time.Second, func() (bool, string) {
			probs := e.status(e.wc1).Problems()
			return len(probs) == 1 && probs[0].SHA256 == sha && probs[0].State == osimage.StateNotServed, fmt.Sprint(probs)
		})
		t.Logf("live check reported the unserved image %.1fs after the change", time.Since(start).Seconds())
		testenv.Eventually(t, "event on namespace wc1", 30*time.Second, func() (bool, string) {
			evs := e.namespaceEvents(e.wc1, "ImageNotServed")
			return len(evs) > 0 && strings.Contains(evs[0], "is currently not served by mgmt cluster os-image-server"), fmt.Sprint(evs)
		})
		testenv.Eventually(t, "metric osimages_cluster_images_unserved", 10*time.Second, func() (bool, string) {
			resp, err := http.Get("http://" + e.metricsAddr + "/metrics")
			if err != nil {
				return false, err.Error()
			}
			body := readAll(t, resp)
			return strings.Contains(body, `osimages_cluster_images_unserved{namespace="`+e.wc1+`",state="not-served"} 1`) &&
				strings.Contains(body, `osimages_cluster_images_unserved{namespace="`+e.wc2+`",state="not-served"} 0`), grepLines(body, "unserved")
		})
		for _, ns := range []string{e.wc2, e.wc3} {
			if p := e.status(ns).Problems(); len(p) != 0 {
				t.Errorf("%s reports problems it does not have: %v", ns, p)
			}
		}

		before := e.templates()
		r = e.render(e.wc1, e.clusters[e.wc1])
		wantErr := "image " + sha.String() + "/" + img132 + " is currently not served by mgmt cluster os-image-server"
		if r.code != 1 || !strings.Contains(r.stderr, wantErr) {
			t.Fatalf("render wc1: want exit 1 with %q, got %d:\n%s", wantErr, r.code, r.stderr)
		}
		if after := e.templates(); !mapsEqual(after, before) {
			t.Fatalf("a failed render changed templates:%s", diffMaps(before, after))
		}

		// Deselected for longer than the grace period, but referenced by
		// wc1's templates: kept on disk and served. The witness, deselected
		// by the same change, leaves the status page when garbage
		// collection deletes it: that pass went over wc1's image too.
		testenv.Eventually(t, "the unreferenced witness collected", 30*time.Second, func() (bool, string) {
			resp, err := http.Get(e.serve.url("/"))
			if err != nil {
				return false, err.Error()
			}
			page := readAll(t, resp)
			return !strings.Contains(page, "<td>witness</td>"), grepLines(page, "deselected")
		})
		if got, code := sha256Of(t, e.serve.url("/images/"+sha.String()+"/"+filename)); code != 200 || got != sha.String() {
			t.Fatalf("a referenced image is no longer served: HTTP %d\n%s", code, e.serve.stderr)
		}
		resp, err := http.Get(e.serve.url("/"))
		if err != nil {
			t.Fatal(err)
		}
		page := readAll(t, resp)
		if !strings.Contains(page, "kept: still referenced by Metal3MachineTemplate "+e.wc1+"/") {
			t.Errorf("status page does not say the image is kept:\n%s", page)
		}

		// A machine stamped from the old template references the image too.
		machines := e.dyn.Resource(templatesGVR.GroupVersion().WithResource("metal3machines")).Namespace(e.wc1)
		machine := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": templatesGVR.GroupVersion().String(), "kind": "Metal3Machine",
			"metadata": map[string]any{"name": e.wc1 + "-md0-machine"},
			"spec": map[string]any{"image": map[string]any{
				"url": e.serve.url("/images/" + sha.String() + "/" + filename), "checksum": sha.String(), "checksumType": "sha256", "diskFormat": "raw"}},
		}}
		if _, err := machines.Create(ctx, machine, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}

		// wc1 moves to a served image (the operator's fix) and its old
		// templates go: the machine still holds the image; once it goes
		// too, the image is collected.
		e.applyConfigMap(e.wc1, "catalog", map[string]string{fleet.CatalogValuesLabel: ""}, e.catalogInputs("0.7.8"))
		e.waitCatalog(e.wc1, img132, e.sha(img132+":0.7.8"))
		// The management cluster's own image since its bump, downloaded.
		e.waitCopy(e.wc1, e.sha(img132+":0.7.8"), true, true)
		if r := e.render(e.wc1, e.clusters[e.wc1]); r.code != 0 {
			t.Fatalf("render wc1 on a served image: %d\n%s", r.code, r.stderr)
		}
		for _, name := range namesIn(before, e.wc1) {
			if err := e.dyn.Resource(templatesGVR).Namespace(e.wc1).Delete(ctx, strings.TrimPrefix(name, e.wc1+"/"), metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		testenv.Eventually(t, "the machine alone keeps the image", 30*time.Second, func() (bool, string) {
			resp, err := http.Get(e.serve.url("/"))
			if err != nil {
				return false, err.Error()
			}
			page := readAll(t, resp)
			return strings.Contains(page, "kept: still referenced by Metal3Machine "+e.wc1+"/"+machine.GetName()+"<"), grepLines(page, "kept")
		})
		if _, code := sha256Of(t, e.serve.url("/images/"+sha.String()+"/"+filename)); code != 200 {
			t.Fatalf("an image a machine references is not served: %d", code)
		}
		if err := machines.Delete(ctx, machine.GetName(), metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, "the unreferenced image is collected", 30*time.Second, func() (bool, string) {
			_, code := sha256Of(t, e.serve.url("/images/"+sha.String()+"/"+filename))
			return code == 404, fmt.Sprint(code)
		})
	})

	t.Run("a workload cluster bumps its own version: exactly its templates are renamed", func(t *testing.T) {
		e := newFleet(t, "fleet-wc-bump", 400, nil)
		e.extra["wc2-ubuntu-next"] = img131 + ":0.7.7"
		e.setMgmt("0.7.8")
		next := e.sha(img131 + ":0.7.7")
		e.waitCopy(e.wc2, next, true, true)
		e.applyConfigMap(e.wc2, "catalog", map[string]string{fleet.CatalogValuesLabel: ""}, e.catalogInputs("0.7.7"))
		e.waitCatalog(e.wc2, img131, next)
		if r := e.render(e.wc2, e.clusters[e.wc2]); r.code != 0 {
			t.Fatalf("render wc2: %d\n%s", r.code, r.stderr)
		}
		after := e.templates()
		for _, ns := range []string{e.wc1, e.wc3} {
			if !slices.Equal(namesIn(after, ns), namesIn(e.initial, ns)) {
				t.Errorf("%s templates changed: %v -> %v", ns, namesIn(e.initial, ns), namesIn(after, ns))
			}
			for _, name := range namesIn(e.initial, ns) {
				if after[name] != e.initial[name] {
					t.Errorf("%s was written", name)
				}
			}
		}
		added := 0
		for _, name := range namesIn(after, e.wc2) {
			if _, ok := e.initial[name]; !ok {
				added++
			}
		}
		if added != 2 {
			t.Errorf("wc2: want 2 new templates (cp, md0), got %v (before %v)", namesIn(after, e.wc2), namesIn(e.initial, e.wc2))
		}
	})

	t.Run("an image still downloading is reported not yet available", func(t *testing.T) {
		e := newFleet(t, "fleet-downloading", 500, nil)
		p := e.published[img132+":0.7.9"]
		sha := imageSHA(t, p)
		e.gate.hold(p.LayerDigest.String())
		defer e.gate.release(p.LayerDigest.String())
		e.extra["wc3-ubuntu-next"] = img132 + ":0.7.9"
		e.setMgmt("0.7.8")
		e.waitCopy(e.wc3, sha, true, false)
		e.applyConfigMap(e.wc3, "catalog", map[string]string{fleet.CatalogValuesLabel: ""}, e.catalogInputs("0.7.9"))
		e.waitCatalog(e.wc3, img132, sha)
		testenv.Eventually(t, "the check reports not available", 30*time.Second, func() (bool, string) {
			probs := e.status(e.wc3).Problems()
			return len(probs) == 1 && probs[0].SHA256 == sha && probs[0].State == osimage.StateNotAvailable, fmt.Sprint(probs)
		})
		testenv.Eventually(t, "ImageNotAvailable event", 30*time.Second, func() (bool, string) {
			evs := e.namespaceEvents(e.wc3, "ImageNotAvailable")
			return len(evs) > 0, fmt.Sprint(evs)
		})
		before := e.templates()
		r := e.render(e.wc3, e.clusters[e.wc3])
		if r.code != 1 || !strings.Contains(r.stderr, "not available yet") || strings.Contains(r.stderr, "is currently not served") {
			t.Fatalf("render wc3: want 'not available yet', not 'not served'; got exit %d:\n%s", r.code, r.stderr)
		}
		if after := e.templates(); !mapsEqual(after, before) {
			t.Fatalf("a failed render changed templates:%s", diffMaps(before, after))
		}
		e.gate.release(p.LayerDigest.String())
		e.waitCopy(e.wc3, sha, true, true)
		if r := e.render(e.wc3, e.clusters[e.wc3]); r.code != 0 {
			t.Fatalf("render wc3 once available: %d\n%s", r.code, r.stderr)
		}
		testenv.Eventually(t, "the check clears", 30*time.Second, func() (bool, string) {
			probs := e.status(e.wc3).Problems()
			return len(probs) == 0, fmt.Sprint(probs)
		})
	})
}

// startDaemon starts a long-running osimages command.
func startDaemon(t testing.TB, args ...string) *serveProcess {
	t.Helper()
	d := &serveProcess{stderr: &bytes.Buffer{}, done: make(chan struct{})}
	d.cmd = exec.Command(binary, args...)
	d.cmd.Stderr = d.stderr
	d.cmd.Env = append(os.Environ(), "DOCKER_CONFIG="+t.TempDir())
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { d.cmd.Wait(); close(d.done) }()
	t.Cleanup(func() { d.kill(syscall.SIGTERM) })
	return d
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// diffMaps shows what differs between two sets of objects.
func diffMaps(before, after map[string]string) string {
	var b strings.Builder
	for k, v := range before {
		if w, ok := after[k]; !ok {
			fmt.Fprintf(&b, "\n%s deleted", k)
		} else if w != v {
			fmt.Fprintf(&b, "\n%s changed:\n  before %s\n  after  %s", k, v, w)
		}
	}
	for k := range after {
		if _, ok := before[k]; !ok {
			fmt.Fprintf(&b, "\n%s created", k)
		}
	}
	return b.String()
}

func readAll(t *testing.T, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	var b strings.Builder
	if _, err := io.Copy(&b, resp.Body); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
