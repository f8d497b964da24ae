//go:build e2e

package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v4/pkg/action"
	chartv2 "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/kube"
	releasev1 "helm.sh/helm/v4/pkg/release/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/restmapper"
)

const (
	releaseName = "osimages"
	// releaseNS is Sylva's namespace for the image server.
	releaseNS = "sylva-system"
	// helmTimeout bounds one install, upgrade or rollback, waits included.
	helmTimeout = 6 * time.Minute
)

// helm is Helm's action library bound to the cluster and the release
// namespace, as the helm CLI is with --kubeconfig and -n. It asks the
// apiserver for its version and APIs, as `helm install` does.
type helm struct {
	t   *testing.T
	cfg *action.Configuration
	ch  *chartv2.Chart
}

func newHelm(t *testing.T) *helm {
	t.Helper()
	flags := genericclioptions.NewConfigFlags(false)
	flags.KubeConfig = &env.kubeconfig
	ns := releaseNS
	flags.Namespace = &ns
	cfg := action.NewConfiguration(action.ConfigurationSetLogger(slog.DiscardHandler))
	if err := cfg.Init(flags, releaseNS, "secret"); err != nil {
		t.Fatal(err)
	}
	ch, err := loader.Load(env.chart)
	if err != nil {
		t.Fatal(err)
	}
	return &helm{t: t, cfg: cfg, ch: ch}
}

// The waits are Helm's own (--wait=watcher --wait-for-jobs): every
// Deployment and StatefulSet rolled out with ready pods, every Job
// complete, every PVC bound.

func (h *helm) install(vals map[string]any) *releasev1.Release {
	h.t.Helper()
	in := action.NewInstall(h.cfg)
	in.ReleaseName, in.Namespace = releaseName, releaseNS
	in.WaitStrategy, in.WaitForJobs, in.Timeout = kube.StatusWatcherStrategy, true, helmTimeout
	return h.release("install", func(c context.Context) (any, error) { return in.RunWithContext(c, h.ch, vals) })
}

func (h *helm) upgrade(vals map[string]any) *releasev1.Release {
	h.t.Helper()
	up := action.NewUpgrade(h.cfg)
	up.Namespace = releaseNS
	up.WaitStrategy, up.WaitForJobs, up.Timeout = kube.StatusWatcherStrategy, true, helmTimeout
	return h.release("upgrade", func(c context.Context) (any, error) { return up.RunWithContext(c, releaseName, h.ch, vals) })
}

func (h *helm) rollback(version int) {
	h.t.Helper()
	rb := action.NewRollback(h.cfg)
	rb.Version = version
	rb.WaitStrategy, rb.WaitForJobs, rb.Timeout = kube.StatusWatcherStrategy, true, helmTimeout
	start := time.Now()
	if err := rb.Run(releaseName); err != nil {
		h.t.Fatalf("helm rollback to %d: %v", version, err)
	}
	h.t.Logf("helm rollback to revision %d: %.1f s", version, time.Since(start).Seconds())
}

func (h *helm) uninstall() {
	h.t.Helper()
	un := action.NewUninstall(h.cfg)
	un.WaitStrategy, un.Timeout = kube.StatusWatcherStrategy, helmTimeout
	if _, err := un.Run(releaseName); err != nil {
		h.t.Fatalf("helm uninstall: %v", err)
	}
}

// current is the deployed release.
func (h *helm) current() *releasev1.Release {
	h.t.Helper()
	r, err := action.NewGet(h.cfg).Run(releaseName)
	if err != nil {
		h.t.Fatal(err)
	}
	rel, ok := r.(*releasev1.Release)
	if !ok {
		h.t.Fatalf("helm get returned a %T", r)
	}
	return rel
}

// manifestObjects decodes the objects of a release's manifest.
func manifestObjects(t testing.TB, rel *releasev1.Release) []*unstructured.Unstructured {
	t.Helper()
	dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(rel.Manifest), 4096)
	var out []*unstructured.Unstructured
	for {
		var m map[string]any
		if err := dec.Decode(&m); errors.Is(err, io.EOF) {
			return out
		} else if err != nil {
			t.Fatalf("release manifest: %v", err)
		}
		if len(m) > 0 {
			out = append(out, &unstructured.Unstructured{Object: m})
		}
	}
}

// exists says whether the cluster has the object.
func exists(t testing.TB, o *unstructured.Unstructured) bool {
	t.Helper()
	gvk := o.GroupVersionKind()
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(env.kube.Discovery()))
	m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		t.Fatalf("%s: %v", gvk, err)
	}
	res := env.dyn.Resource(m.Resource)
	var get func() error
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		ns := o.GetNamespace()
		if ns == "" {
			ns = releaseNS
		}
		get = func() error { _, err := res.Namespace(ns).Get(ctx(), o.GetName(), metav1.GetOptions{}); return err }
	} else {
		get = func() error { _, err := res.Get(ctx(), o.GetName(), metav1.GetOptions{}); return err }
	}
	err = get()
	if apierrors.IsNotFound(err) {
		return false
	}
	if err != nil {
		t.Fatal(err)
	}
	return true
}

func describe(o *unstructured.Unstructured) string {
	if o.GetNamespace() == "" {
		return o.GetKind() + " " + o.GetName()
	}
	return o.GetKind() + " " + o.GetNamespace() + "/" + o.GetName()
}

func (h *helm) release(what string, do func(context.Context) (any, error)) *releasev1.Release {
	h.t.Helper()
	start := time.Now()
	r, err := do(context.Background())
	if err != nil {
		h.t.Fatalf("helm %s: %v", what, err)
	}
	rel, ok := r.(*releasev1.Release)
	if !ok {
		h.t.Fatalf("helm %s returned a %T", what, r)
	}
	h.t.Logf("helm %s: revision %d %s in %.1f s", what, rel.Version, rel.Info.Status, time.Since(start).Seconds())
	return rel
}

// values are the chart values of the scenarios: the image `make image`
// built (imported into the node's containerd, never pulled), the catalog
// Job on the registry in the cluster, volumes from the local class.
type values struct {
	reg *registry
	// selected are the keys the server serves besides what the management
	// cluster's own selector picks.
	selected []string
	replicas int
	// proxy, when set, is the proxies value (nothing listens there: every
	// address the components reach is in no_proxy).
	proxy string
	// extraCatalog adds a hand-declared image to the catalog values.
	extraCatalog bool
}

func (v values) render() map[string]any {
	selectors := map[string]any{}
	for _, key := range v.selected {
		selectors["e2e-"+key] = map[string]any{"_os_images_key_": key}
	}
	cat := v.reg.catalogValues()
	if v.extraCatalog {
		cat["os_images"] = map[string]any{extraKey: map[string]any{
			"uri":          "https://files.example.org/e2e.qcow2",
			"sha256":       "0f3a6f0f7c4c3f4e6b5f0e0d7a1a4c9e8b7d6c5b4a39281706f5e4d3c2b1a090",
			"image-format": "qcow2",
			"filename":     "e2e.qcow2",
		}}
	}
	vals := map[string]any{
		// The image make image built, imported into the node's containerd:
		// the chart's default pull policy (IfNotPresent) finds it there.
		"image": map[string]any{"repository": "osimages", "tag": "dev"},
		// The registry of the cluster speaks plain HTTP, as a registry
		// mirror of a lab might.
		"oci_registry_insecure":                true,
		"os_image_server_additional_selectors": selectors,
		"osImagePersistenceDefaults":           map[string]any{"size": "2Gi"},
		"server": map[string]any{
			"replicas": v.replicas,
			// The volumes are small: no margin of a GiB on them.
			"freeSpaceMargin": "64Mi",
			"stallTimeout":    "20s",
		},
		"networkPolicy": map[string]any{"egressPorts": []any{443, 5000, 6443}},
		"catalogJob":    map[string]any{"enabled": true, "values": cat},
		// The management cluster's registries with their cosign key, as
		// sylva-units gives them: the server checks the signature of every
		// image before its first byte.
		"cluster":    map[string]any{"os_images_oci_registries": v.reg.serverRegistries()},
		"controller": map[string]any{"replicas": 2},
	}
	if v.proxy != "" {
		vals["proxies"] = map[string]any{
			"http_proxy": v.proxy, "https_proxy": v.proxy,
			"no_proxy": fmt.Sprintf("%s,%s,%s,.svc,.cluster.local,localhost,127.0.0.1", "10.213.0.0/24", "10.214.0.0/16", "10.215.0.0/24"),
		}
	}
	return vals
}
