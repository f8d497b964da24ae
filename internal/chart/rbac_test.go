package chart

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/sylva-projects/osimages/internal/devregistry"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/testenv"
)

// process is a component running as a child process for the test.
type process struct {
	cmd    *exec.Cmd
	mu     sync.Mutex
	stderr bytes.Buffer
}

func (p *process) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stderr.Write(b)
}

func (p *process) log() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.stderr.String()
	if len(s) > 4000 {
		s = "..." + s[len(s)-4000:]
	}
	return s
}

func start(t *testing.T, args ...string) *process {
	t.Helper()
	p := &process{cmd: exec.Command(osimagesBinary(t), args...)}
	p.cmd.Stdout, p.cmd.Stderr = p, p
	p.cmd.Env = append(os.Environ(), "DOCKER_CONFIG="+t.TempDir())
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { p.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			p.cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("%s log:\n%s", args[0], p.log())
		}
	})
	return p
}

// configFile returns key of the rendered ConfigMap name as a file, so that
// the components read exactly what the chart mounts.
func configFile(t *testing.T, r *Rendered, name, key string) string {
	t.Helper()
	cm := r.Find("ConfigMap", name)
	if cm == nil {
		t.Fatalf("the chart renders no ConfigMap %s", name)
	}
	data, _, _ := unstructuredString(cm.Object, "data", key)
	path := filepath.Join(t.TempDir(), key)
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func unstructuredString(obj map[string]any, fields ...string) (string, bool, error) {
	cur := any(obj)
	for _, f := range fields {
		m, ok := cur.(map[string]any)
		if !ok {
			return "", false, nil
		}
		cur = m[f]
	}
	s, ok := cur.(string)
	return s, ok, nil
}

// TestComponentsRunWithChartRBAC installs the chart's objects into envtest
// for real, then runs each component (the built binary, with the files the
// chart mounts) as its own service account, bound only to the chart's
// Roles. Its work must succeed, and writes outside its scope must be
// refused by the apiserver.
func TestComponentsRunWithChartRBAC(t *testing.T) {
	k := apiserver(t)
	ctx := context.Background()
	const ns = "sylva-system"
	ensureNamespace(t, k, ns, nil)

	// Two diskimage-builder artifacts on a TLS registry whose CA the chart
	// hands to the components (oci_registry_extra_ca_certs).
	reg := testenv.Registry(t, devregistry.Options{TLS: true})
	published := map[string]devregistry.Published{}
	for i, hardened := range []string{"false", "true"} {
		key := "ubuntu-plain"
		if hardened == "true" {
			key = "ubuntu-hardened"
		}
		p, err := reg.Publish(ctx, devregistry.DiskImage{
			Repository: "dib/" + key, Tag: "1.0", Gzip: true,
			Content: devregistry.DiskContent(256<<10, uint64(i+1)),
			Fields:  osimage.Image{"os": "ubuntu", "hardened": hardened, "k8s-flavor": "rke2", "k8s-version": "1.32.5+rke2r1"},
		})
		if err != nil {
			t.Fatal(err)
		}
		published[key] = p
	}
	ca, err := os.ReadFile(reg.CAFile)
	if err != nil {
		t.Fatal(err)
	}

	catalogValues := fmt.Sprintf(`
os_images_oci_registries:
  dib: {url: "oci://%s/dib", tag: "1.0"}
sylva_diskimagebuilder_images:
  ubuntu-plain: {os_images_oci_registry: dib}
  ubuntu-hardened: {os_images_oci_registry: dib}
`, reg.Host)
	// The defaults (the fleet controller) plus the server's selectors and
	// the catalog Job.
	install := func(t *testing.T, extra string) *Rendered {
		t.Helper()
		// The selectors as Sylva finalizes them, and the management
		// cluster's values as the README's mapping shows them (no name:
		// the server names no template).
		vals, err := LoadValues([]byte("os_image_selectors:\n- {os: ubuntu, hardened: false}\n" +
			"cluster: {k8s_version: v1.32.5+rke2r1, capi_providers: {infra_provider: capm3, bootstrap_provider: cabpr}}\n" + extra))
		if err != nil {
			t.Fatal(err)
		}
		cat, err := LoadValues([]byte(catalogValues))
		if err != nil {
			t.Fatal(err)
		}
		vals["catalogJob"] = map[string]any{"enabled": true, "values": cat}
		vals["oci_registry_extra_ca_certs"] = string(ca)
		r, err := Render(chartDir, Release{Name: "osimages", Namespace: ns}, vals)
		if err != nil {
			t.Fatal(err)
		}
		if err := newApplier(t, k.Config).apply(ctx, r.Objects, false); err != nil {
			t.Fatalf("installing the chart's objects: %v", err)
		}
		return r
	}
	r := install(t, "")
	caFile := configFile(t, r, "osimages-registry-ca", "ca.crt")
	// An object of each kind no component may touch.
	other, err := k.Client.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "someone-elses"}, Data: map[string]string{"a": "b"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	// Every metric family the running components export, to hold the
	// alerts and the dashboard against.
	exported := map[string]bool{}

	// As installed, before the catalog Job has run: os-images-info exists
	// empty. The server is up and says it waits; that is no error.
	t.Run("server waits for the catalog", func(t *testing.T) {
		kubeconfig, _ := serviceAccountKubeconfig(t, k, ns, "osimages-server")
		values := configFile(t, r, "osimages-server-values", "values.yaml")
		args := serverArgs(t, k, ns, r, map[string]string{
			"--data": t.TempDir(), "--listen": "127.0.0.1:0", "--values": values, "--ca-file": caFile,
		})
		srv := start(t, append(args, "--kubeconfig", kubeconfig)...)
		base := serverURL(t, srv)
		testenv.Eventually(t, "the server reports waiting-for-catalog", 60*time.Second, func() (bool, string) {
			page := httpGet(base + "/metrics")
			return strings.Contains(page, `osimages_server_phase{phase="waiting-for-catalog"} 1`), grepMetric(page, "osimages_server_phase")
		})
		// Ready while it waits, once it has read its peers (a set of one
		// here): the kubelet's probe asks again until then.
		testenv.Eventually(t, "/readyz while waiting for the catalog", 30*time.Second, func() (bool, string) {
			got := httpGet(base + "/readyz")
			return got == "ok\n", got
		})
		if page := httpGet(base + "/metrics"); !strings.Contains(page, `osimages_server_phase{phase="waiting-for-catalog"} 1`) {
			t.Errorf("ready, but no longer waiting for the catalog: %s", grepMetric(page, "osimages_server_phase"))
		}
		if page := httpGet(base + "/"); !strings.Contains(page, "Waiting for the catalog") || !strings.Contains(page, "os-images-info has no values.yaml yet") {
			t.Errorf("the status page does not say that it waits for os-images-info:\n%s", page)
		}
		if strings.Contains(srv.log(), `"level":"ERROR"`) {
			t.Errorf("the server logs an ERROR in a correct configuration:\n%s", srv.log())
		}
	})

	t.Run("catalog", func(t *testing.T) {
		kubeconfig, cfg := serviceAccountKubeconfig(t, k, ns, "osimages-catalog")
		values := configFile(t, r, "osimages-catalog-values", "values.yaml")
		var job *unstructured.Unstructured
		for _, o := range r.Objects {
			if o.GetKind() == "Job" {
				job = o
			}
		}
		args := podArgs(t, job, map[string]string{"--values": values, "--ca-file": caFile})
		cmd := exec.Command(osimagesBinary(t), append(args, "--kubeconfig", kubeconfig)...)
		cmd.Env = append(os.Environ(), "DOCKER_CONFIG="+t.TempDir())
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("osimages catalog --apply as the catalog Job's account: %v\n%s", err, out)
		}
		info, err := k.Client.CoreV1().ConfigMaps(ns).Get(ctx, "os-images-info", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range published {
			if !strings.Contains(info.Data["values.yaml"], p.Fields.Get("sha256")) {
				t.Errorf("os-images-info lacks %s", p.Ref)
			}
		}
		outOfScope(t, cfg, ns, other.Name, false)
	})

	t.Run("server", func(t *testing.T) {
		kubeconfig, cfg := serviceAccountKubeconfig(t, k, ns, "osimages-server")
		values := configFile(t, r, "osimages-server-values", "values.yaml")
		args := serverArgs(t, k, ns, r, map[string]string{
			"--data": t.TempDir(), "--listen": "127.0.0.1:0", "--values": values, "--ca-file": caFile,
		})
		srv := start(t, append(args, "--kubeconfig", kubeconfig)...)
		plain, hardened := published["ubuntu-plain"].Fields.Get("sha256"), published["ubuntu-hardened"].Fields.Get("sha256")
		testenv.Eventually(t, "the server publishes the selected image as available", 90*time.Second, func() (bool, string) {
			cm, err := k.Client.CoreV1().ConfigMaps(ns).Get(ctx, "capm3-os-image-server-os-images", metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			doc := cm.Data["values.yaml"]
			served, err := osimage.ParseServed([]byte(doc))
			if err != nil {
				return false, err.Error()
			}
			e, ok := served[osimage.SHA256(plain)]
			return ok && e.Available && len(served) == 1 && !strings.Contains(doc, hardened), doc
		})
		if metal3 && strings.Contains(strings.ToLower(srv.log()), "forbidden") {
			t.Errorf("the server was refused something it needs:\n%s", srv.log())
		}
		// Selectors and cluster values without a name: no false ERROR
		// (and so no "selection problems" on the status page either).
		if strings.Contains(srv.log(), `"level":"ERROR"`) {
			t.Errorf("the server logs an ERROR in a correct configuration:\n%s", srv.log())
		}
		base := serverURL(t, srv)
		if page := httpGet(base + "/"); strings.Contains(page, "Selection problems") {
			t.Errorf("the status page shows selection problems:\n%s", page)
		}
		maps.Copy(exported, exportedNames(httpGet(base+"/metrics")))
		// Its output deleted by hand is created again within seconds: the
		// server may create ConfigMaps in its namespace only because the
		// create guard (a ValidatingAdmissionPolicy) refuses any name but
		// its output's.
		const output = "capm3-os-image-server-os-images"
		before, err := k.Client.CoreV1().ConfigMaps(ns).Get(ctx, output, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := k.Client.CoreV1().ConfigMaps(ns).Delete(ctx, output, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, "the server publishes its output deleted by hand again", 60*time.Second, func() (bool, string) {
			cm, err := k.Client.CoreV1().ConfigMaps(ns).Get(ctx, output, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			return cm.Data["values.yaml"] == before.Data["values.yaml"], cm.Data["values.yaml"]
		})
		testenv.Eventually(t, "the create guard refuses the server any other ConfigMap", 30*time.Second, func() (bool, string) {
			_, err := kubernetes.NewForConfigOrDie(cfg).CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "planted"}}, metav1.CreateOptions{})
			if err == nil {
				_ = k.Client.CoreV1().ConfigMaps(ns).Delete(ctx, "planted", metav1.DeleteOptions{})
			}
			return apierrors.IsForbidden(err) && strings.Contains(err.Error(), "creates only its output"), fmt.Sprint(err)
		})
		outOfScope(t, cfg, ns, other.Name, false)
		cs := kubernetes.NewForConfigOrDie(cfg)
		// Its input is read-only.
		_, err = cs.CoreV1().ConfigMaps(ns).Patch(ctx, "os-images-info", types.MergePatchType, []byte(`{"data":{"x":"y"}}`), metav1.PatchOptions{})
		wantForbidden(t, "server patches its input os-images-info", err)
		_, err = cs.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{})
		wantForbidden(t, "server lists every ConfigMap of its namespace", err)
		if metal3 {
			dyn := dynamic.NewForConfigOrDie(cfg)
			for _, res := range []string{"metal3machinetemplates", "metal3machines"} {
				gvr := schema.GroupVersionResource{Group: "infrastructure.cluster.x-k8s.io", Version: "v1beta1", Resource: res}
				_, err := dyn.Resource(gvr).List(ctx, metav1.ListOptions{})
				wantAllowed(t, "server lists "+res+" in all namespaces", err)
				err = dyn.Resource(gvr).Namespace(ns).Delete(ctx, "any", metav1.DeleteOptions{})
				wantForbidden(t, "server deletes a "+res, err)
			}
		} else {
			t.Log("Metal3 CRDs absent (shared/crds/metal3): the read-only Metal3 access is not exercised")
		}
	})

	t.Run("propagation", func(t *testing.T) {
		r := install(t, "controller: {enabled: false}\npropagation: {enabled: true}\n")
		kubeconfig, cfg := serviceAccountKubeconfig(t, k, ns, "osimages-propagate")
		rules := configFile(t, r, "osimages-rules", "rules.yaml")
		args := podArgs(t, r.Find("Deployment", "osimages-propagate"), map[string]string{"--config": rules, "--metrics-addr": "0", "--health-addr": "0"})
		start(t, append(args, "--kubeconfig", kubeconfig)...)
		ensureNamespace(t, k, "wc1", map[string]string{"sylva-project.org/workload-cluster": ""})
		if _, err := k.Client.CoreV1().ConfigMaps(ns).Patch(ctx, "capm3-os-image-server-os-images", types.MergePatchType,
			[]byte(`{"data":{"values.yaml":"capm3_os_image_server_images: {}\n"}}`), metav1.PatchOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
		testenv.Eventually(t, "the copy reaches the workload-cluster namespace", 60*time.Second, func() (bool, string) {
			src, err := k.Client.CoreV1().ConfigMaps(ns).Get(ctx, "capm3-os-image-server-os-images", metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			cp, err := k.Client.CoreV1().ConfigMaps("wc1").Get(ctx, "kyverno-cloned-os-image-server-images", metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			return cp.Data["values.yaml"] == src.Data["values.yaml"], cp.Data["values.yaml"]
		})
		tamperAndWaitRestored(t, k, "wc1", "kyverno-cloned-os-image-server-images")
		if _, err := k.Client.CoordinationV1().Leases(ns).Get(ctx, "osimages-propagate", metav1.GetOptions{}); err != nil {
			t.Errorf("no leader-election Lease: %v", err)
		}
		// RBAC cannot restrict create to a name: propagation may create
		// ConfigMaps (the chart says so); everything else is checked.
		outOfScope(t, cfg, ns, other.Name, true)
		cs := kubernetes.NewForConfigOrDie(cfg)
		err := cs.CoreV1().ConfigMaps(ns).Delete(ctx, "capm3-os-image-server-os-images", metav1.DeleteOptions{})
		wantForbidden(t, "propagation deletes its source", err)
		_, err = cs.CoordinationV1().Leases("wc1").Create(ctx, leaseNamed("x"), metav1.CreateOptions{})
		wantForbidden(t, "propagation creates a Lease outside its namespace", err)
	})

	t.Run("controller", func(t *testing.T) {
		// The test registry is not in the management values: the
		// operator allows it (controller.catalogAllowedRegistries).
		r := install(t, fmt.Sprintf("controller: {catalogAllowedRegistries: [%q]}\n", reg.Host))
		maps.Copy(exported, controllerRun(t, k, r, ns, caFile, catalogValues, other.Name, published))
	})

	// fleetNeeds.enabled: the server reads the fleet's needs, that one
	// ConfigMap of the release namespace, and may not write it.
	t.Run("server serving the fleet's needs", func(t *testing.T) {
		r := install(t, "fleetNeeds: {enabled: true}\n")
		kubeconfig, cfg := serviceAccountKubeconfig(t, k, ns, "osimages-server")
		need := strings.Repeat("f", 64)
		doc := "images:\n- sha256: " + need + "\n  namespaces: [wc-rbac]\n"
		cms := k.Client.CoreV1().ConfigMaps(ns)
		cm, err := cms.Get(ctx, "osimages-fleet-needs", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			_, err = cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "osimages-fleet-needs", Labels: map[string]string{"osimages.sylva-project.org/fleet-needs": ""}},
				Data: map[string]string{"needs.yaml": doc}}, metav1.CreateOptions{})
		} else if err == nil {
			cm.Data = map[string]string{"needs.yaml": doc}
			_, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
		}
		if err != nil {
			t.Fatal(err)
		}
		values := configFile(t, r, "osimages-server-values", "values.yaml")
		args := serverArgs(t, k, ns, r, map[string]string{
			"--data": t.TempDir(), "--listen": "127.0.0.1:0", "--values": values, "--ca-file": caFile,
		})
		srv := start(t, append(args, "--kubeconfig", kubeconfig)...)
		testenv.Eventually(t, "the server publishes its refusal of the need", 90*time.Second, func() (bool, string) {
			out, err := cms.Get(ctx, "capm3-os-image-server-os-images", metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			return strings.Contains(out.Data["refused-needs.yaml"], need), fmt.Sprint(out.Data)
		})
		if strings.Contains(strings.ToLower(srv.log()), "forbidden") {
			t.Errorf("the server was refused something it needs:\n%s", srv.log())
		}
		maps.Copy(exported, exportedNames(httpGet(serverURL(t, srv)+"/metrics")))
		_, err = kubernetes.NewForConfigOrDie(cfg).CoreV1().ConfigMaps(ns).Patch(ctx, "osimages-fleet-needs", types.MergePatchType, []byte(`{"data":{"x":"y"}}`), metav1.PatchOptions{})
		wantForbidden(t, "server patches the fleet's needs", err)
	})

	// The alerts and the dashboard read metrics the components really
	// export: the server's and the controller's (which includes
	// propagation), scraped while they ran the work above.
	t.Run("alerts read exported metrics", func(t *testing.T) {
		if len(exported) == 0 {
			t.Skip("the components did not run")
		}
		checkExpressionsAgainst(t, exported)
	})
}

// controllerRun is the fleet controller's part of
// TestComponentsRunWithChartRBAC, run after the others. It returns the
// metric families the controller exported.
func controllerRun(t *testing.T, k *testenv.Kube, r *Rendered, ns, caFile, catalogValues, otherConfigMap string, published map[string]devregistry.Published) map[string]bool {
	ctx := context.Background()
	kubeconfig, cfg := serviceAccountKubeconfig(t, k, ns, "osimages-controller")
	rules := configFile(t, r, "osimages-rules", "rules.yaml")
	d := r.Find("Deployment", "osimages-controller")
	if d == nil {
		t.Fatal("the defaults deploy no controller")
	}
	// The Deployment's own arguments, with the files it mounts and the
	// ports of a test.
	metricsAddr := freeAddr(t)
	args := podArgs(t, d, map[string]string{"--config": rules, "--ca-file": caFile, "--metrics-addr": metricsAddr, "--health-addr": "0",
		"--catalog-registries-from": configFile(t, r, "osimages-catalog-registries", "values.yaml")})
	start(t, append(args, "--kubeconfig", kubeconfig)...)

	// A workload cluster's namespace with its own catalog inputs.
	ensureNamespace(t, k, "wc2", map[string]string{"sylva-project.org/workload-cluster": ""})
	if _, err := k.Client.CoreV1().ConfigMaps("wc2").Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "catalog", Labels: map[string]string{"osimages.sylva-project.org/catalog-values": ""}},
		Data:       map[string]string{"values.yaml": catalogValues},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"os-images-info", "kyverno-cloned-os-image-server-images", "osimages-status"} {
		testenv.Eventually(t, "the controller writes wc2/"+name, 90*time.Second, func() (bool, string) {
			cm, err := k.Client.CoreV1().ConfigMaps("wc2").Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			if name == "os-images-info" {
				return strings.Contains(cm.Data["values.yaml"], published["ubuntu-plain"].Fields.Get("sha256")), cm.Data["values.yaml"]
			}
			return true, ""
		})
	}
	// Creating is not enough: RBAC restricts updates to the managed names,
	// so an edited copy and an edited status must be put back by update.
	for _, name := range []string{"kyverno-cloned-os-image-server-images", "osimages-status"} {
		tamperAndWaitRestored(t, k, "wc2", name)
	}
	// The fleet's needs, in the release namespace, created and kept as
	// written (an edit is put back).
	testenv.Eventually(t, "the controller publishes the fleet's needs", 60*time.Second, func() (bool, string) {
		cm, err := k.Client.CoreV1().ConfigMaps(ns).Get(ctx, "osimages-fleet-needs", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return strings.HasPrefix(cm.Data["needs.yaml"], "images:"), fmt.Sprint(cm.Data)
	})
	tamperAndWaitRestored(t, k, ns, "osimages-fleet-needs")
	if _, err := k.Client.CoordinationV1().Leases(ns).Get(ctx, "osimages-controller", metav1.GetOptions{}); err != nil {
		t.Errorf("no leader-election Lease osimages-controller: %v", err)
	}
	outOfScope(t, cfg, "wc2", "catalog", true)
	cs := kubernetes.NewForConfigOrDie(cfg)
	_, err := cs.CoreV1().ConfigMaps("wc2").Patch(ctx, "catalog", types.MergePatchType, []byte(`{"data":{"values.yaml":"{}"}}`), metav1.PatchOptions{})
	wantForbidden(t, "controller rewrites a cluster's catalog inputs", err)
	err = cs.CoreV1().ConfigMaps(ns).Delete(ctx, otherConfigMap, metav1.DeleteOptions{})
	wantForbidden(t, "controller deletes another ConfigMap", err)

	// The install of this run rebound the guard to the controller's
	// account (the propagation run had bound it to its own), and the
	// apiserver takes a changed policy in a moment later, not at once:
	// wait for its first refusal before holding every delete to it.
	testenv.Eventually(t, "the delete guard refuses the controller's deletes", 30*time.Second, func() (bool, string) {
		probe := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "kyverno-cloned-os-image-server-images"}}
		if _, err := k.Client.CoreV1().ConfigMaps("kube-system").Create(ctx, probe, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return false, err.Error()
		}
		err := cs.CoreV1().ConfigMaps("kube-system").Delete(ctx, probe.Name, metav1.DeleteOptions{})
		if apierrors.IsForbidden(err) {
			return true, ""
		}
		return false, fmt.Sprintf("delete answered %v", err)
	})

	// Deletes outside what it owns. A catalog or a status is never
	// deleted (RBAC, by name); a ConfigMap of a copy's name that osimages
	// did not make is refused by the delete guard, in kube-system as in a
	// workload cluster's namespace.
	for _, victim := range []struct{ ns, name string }{
		{"kube-system", "os-images-info"}, {"kube-system", "osimages-status"}, {"wc2", "os-images-info"}, {"wc2", "osimages-status"},
		{"kube-system", "kyverno-cloned-os-image-server-images"},
	} {
		if _, err := k.Client.CoreV1().ConfigMaps(victim.ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: victim.name}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
		err := cs.CoreV1().ConfigMaps(victim.ns).Delete(ctx, victim.name, metav1.DeleteOptions{})
		wantForbidden(t, "controller deletes "+victim.ns+"/"+victim.name, err)
	}
	// A copy with a forged rule label of another rule is not its copy
	// either.
	forged := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "kyverno-cloned-os-image-server-images", Namespace: "default",
		Labels: map[string]string{"propagate.osimages.sylva-project.org/rule": "some-other-rule"}}}
	if _, err := k.Client.CoreV1().ConfigMaps("default").Create(ctx, forged, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	err = cs.CoreV1().ConfigMaps("default").Delete(ctx, forged.Name, metav1.DeleteOptions{})
	wantForbidden(t, "controller deletes a ConfigMap labelled for another rule", err)
	if err != nil && !strings.Contains(err.Error(), "osimages deletes only its own copies") {
		t.Errorf("the refusal does not say why: %v", err)
	}

	// Its own copies it may delete: the guard does not stand in the way
	// of propagation. A namespace that stops being a workload cluster's
	// loses its copy, as with Kyverno.
	ns2, err := k.Client.CoreV1().Namespaces().Get(ctx, "wc2", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	delete(ns2.Labels, "sylva-project.org/workload-cluster")
	if _, err := k.Client.CoreV1().Namespaces().Update(ctx, ns2, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "the controller deletes its copy in wc2 once wc2 is no workload cluster's", 60*time.Second, func() (bool, string) {
		_, err := k.Client.CoreV1().ConfigMaps("wc2").Get(ctx, "kyverno-cloned-os-image-server-images", metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
	return exportedNames(httpGet("http://" + metricsAddr + "/metrics"))
}

// serverURL is the base URL the server process says it listens on.
func serverURL(t *testing.T, p *process) string {
	t.Helper()
	re := regexp.MustCompile(`"msg":"serving","address":"([^"]+)"`)
	var addr string
	testenv.Eventually(t, "the server listens", 60*time.Second, func() (bool, string) {
		m := re.FindStringSubmatch(p.log())
		if m != nil {
			addr = m[1]
		}
		return m != nil, p.log()
	})
	return "http://" + addr
}

// httpGet returns the body of url, or the error as text.
func httpGet(url string) string {
	resp, err := http.Get(url)
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err.Error()
	}
	return string(b)
}

func grepMetric(page, name string) string {
	var out []string
	for _, l := range strings.Split(page, "\n") {
		if strings.HasPrefix(l, name) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// freeAddr is testenv.FreeAddr.
func freeAddr(t *testing.T) string { return testenv.FreeAddr(t) }

// podArgs returns the arguments the chart gives obj's container, with the
// values of the flags in local replaced (paths the pod mounts, its ports), so
// that the tests run each component exactly as the chart configures it. A
// flag of local that the chart does not pass is an error: the test would
// otherwise silently run with the default.
func podArgs(t *testing.T, obj *unstructured.Unstructured, local map[string]string) []string {
	t.Helper()
	var args []string
	seen := map[string]bool{}
	for _, a := range stringsOf(container(t, obj)["args"]) {
		if flag, _, ok := strings.Cut(a, "="); ok {
			if v, replace := local[flag]; replace {
				a = flag + "=" + v
				seen[flag] = true
			}
		}
		args = append(args, a)
	}
	for flag := range local {
		if !seen[flag] {
			t.Fatalf("%s %s: the chart passes no %s", obj.GetKind(), obj.GetName(), flag)
		}
	}
	return args
}

// serverArgs are the server's arguments as the chart gives them (podArgs),
// with what the kubelet and the EndpointSlice controller give a running
// pod: $(POD_NAME) expanded, $(OSIMAGES_REPLICAS) from the key of the
// ConfigMap its env names, and the pod listed ready in the headless
// Service's EndpointSlice. Every replica runs as one of a set, a single one
// too, and counts what is available over the ready replicas listed there.
// The apiserver refuses loopback addresses in an EndpointSlice: it names a
// documentation address (RFC 5737), as a replica never connects to itself.
func serverArgs(t *testing.T, k *testenv.Kube, ns string, r *Rendered, local map[string]string) []string {
	t.Helper()
	const pod = "osimages-server-0"
	local["--replica-id"] = pod
	local["--peer-listen"] = "127.0.0.1:0"
	values := r.Find("ConfigMap", "osimages-server-values")
	if values == nil {
		t.Fatal("no ConfigMap osimages-server-values")
	}
	replicas, _, _ := unstructured.NestedString(values.Object, "data", "replicas")
	if replicas == "" {
		t.Fatalf("ConfigMap osimages-server-values has no key replicas, which the server's OSIMAGES_REPLICAS reads")
	}
	local["--replicas"] = replicas
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "osimages-server-headless-e2e", Namespace: ns, Labels: map[string]string{discoveryv1.LabelServiceName: "osimages-server-headless"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{
			Addresses:  []string{"192.0.2.10"},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr(true)},
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: pod},
		}},
		Ports: []discoveryv1.EndpointPort{{Name: ptr("http"), Port: ptr(int32(8080))}, {Name: ptr("peer"), Port: ptr(int32(8081))}},
	}
	_, err := k.Client.DiscoveryV1().EndpointSlices(ns).Create(context.Background(), slice, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	return podArgs(t, r.Find("StatefulSet", "osimages-server"), local)
}

func ptr[T any](v T) *T { return &v }

// tamperAndWaitRestored edits NS/NAME's data as an operator would by mistake
// and waits for the component to put it back, which takes an update.
func tamperAndWaitRestored(t *testing.T, k *testenv.Kube, ns, name string) {
	t.Helper()
	ctx := context.Background()
	if _, err := k.Client.CoreV1().ConfigMaps(ns).Patch(ctx, name, types.MergePatchType, []byte(`{"data":{"values.yaml":"tampered: true\n"}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, ns+"/"+name+" is put back after an edit", 60*time.Second, func() (bool, string) {
		cm, err := k.Client.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return cm.Data["values.yaml"] != "tampered: true\n", cm.Data["values.yaml"]
	})
}

// outOfScope checks what no component may do: write a ConfigMap it does not
// own, and touch Secrets.
func outOfScope(t *testing.T, cfg *rest.Config, ns, otherConfigMap string, mayCreateConfigMaps bool) {
	t.Helper()
	ctx := context.Background()
	cs := kubernetes.NewForConfigOrDie(cfg)
	if !mayCreateConfigMaps {
		// Refused by RBAC, or, for the server, by the create guard: the
		// apiserver takes a new admission policy in a moment after it is
		// created, so a create may slip through just after an install.
		testenv.Eventually(t, "the create of a ConfigMap is refused", 30*time.Second, func() (bool, string) {
			_, err := cs.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{GenerateName: "planted-"}}, metav1.CreateOptions{})
			return apierrors.IsForbidden(err), fmt.Sprint(err)
		})
	}
	_, err := cs.CoreV1().ConfigMaps(ns).Patch(ctx, otherConfigMap, types.MergePatchType, []byte(`{"data":{"a":"changed"}}`), metav1.PatchOptions{})
	wantForbidden(t, "patch of another ConfigMap", err)
	err = cs.CoreV1().ConfigMaps(ns).Delete(ctx, otherConfigMap, metav1.DeleteOptions{})
	wantForbidden(t, "delete of another ConfigMap", err)
	_, err = cs.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "stolen"}}, metav1.CreateOptions{})
	wantForbidden(t, "create of a Secret", err)
	_, err = cs.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{})
	wantForbidden(t, "list of Secrets", err)
}

func leaseNamed(name string) *coordinationv1.Lease {
	return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name}}
}
