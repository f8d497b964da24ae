package chart

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/common"
	chartv2 "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/kube"
	releasecommon "helm.sh/helm/v4/pkg/release/common"
	releasev1 "helm.sh/helm/v4/pkg/release/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"

	"github.com/sylva-projects/osimages/internal/testenv"
	"github.com/sylva-projects/osimages/internal/values"
)

// helm is Helm's action library bound to the envtest apiserver and one
// namespace, as the helm CLI is with --kubeconfig and -n. The release
// records are Secrets, Helm's default storage.
type helm struct {
	t   *testing.T
	k   *testenv.Kube
	ns  string
	cfg *action.Configuration
}

func newHelm(t *testing.T, k *testenv.Kube, ns string) *helm {
	t.Helper()
	flags := genericclioptions.NewConfigFlags(false)
	flags.KubeConfig = &k.Kubeconfig
	flags.Namespace = &ns
	cfg := action.NewConfiguration(action.ConfigurationSetLogger(slog.DiscardHandler))
	if err := cfg.Init(flags, ns, "secret"); err != nil {
		t.Fatal(err)
	}
	// The API versions are the apiserver's own, as Helm asks discovery. The
	// version is the one its sources are (hack/tools/envtest): the binary
	// is built without version stamping and says v0.0.0-master, which the
	// chart's kubeVersion would refuse.
	dc, err := discovery.NewDiscoveryClientForConfig(k.Config)
	if err != nil {
		t.Fatal(err)
	}
	apis, err := action.GetVersionSet(dc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := common.ParseKubeVersion(KubeVersion)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Capabilities = &common.Capabilities{KubeVersion: *kv, APIVersions: apis, HelmVersion: common.DefaultCapabilities.HelmVersion}
	return &helm{t: t, k: k, ns: ns, cfg: cfg}
}

// There is no kubelet: nothing ever becomes ready, so no step waits for
// workloads (the chart has no hooks to wait for either). What the apiserver
// accepts or refuses is what this test is about.
const helmTimeout = 2 * time.Minute

func (h *helm) install(vals map[string]any) (*releasev1.Release, error) {
	in := action.NewInstall(h.cfg)
	in.ReleaseName, in.Namespace = "osimages", h.ns
	in.WaitStrategy, in.Timeout = kube.HookOnlyStrategy, helmTimeout
	return release(in.RunWithContext(context.Background(), loadChart(h.t), vals))
}

func (h *helm) upgrade(vals map[string]any) (*releasev1.Release, error) {
	up := action.NewUpgrade(h.cfg)
	up.Namespace = h.ns
	up.WaitStrategy, up.Timeout = kube.HookOnlyStrategy, helmTimeout
	return release(up.RunWithContext(context.Background(), "osimages", loadChart(h.t), vals))
}

func (h *helm) rollback(version int) error {
	rb := action.NewRollback(h.cfg)
	rb.Version = version
	rb.WaitStrategy, rb.Timeout = kube.HookOnlyStrategy, helmTimeout
	return rb.Run("osimages")
}

func (h *helm) uninstall() error {
	un := action.NewUninstall(h.cfg)
	un.WaitStrategy, un.Timeout = kube.HookOnlyStrategy, helmTimeout
	_, err := un.Run("osimages")
	return err
}

func (h *helm) current() *releasev1.Release {
	h.t.Helper()
	r, err := release(action.NewGet(h.cfg).Run("osimages"))
	if err != nil {
		h.t.Fatal(err)
	}
	return r
}

func release(r any, err error) (*releasev1.Release, error) {
	if err != nil {
		return nil, err
	}
	rel, ok := r.(*releasev1.Release)
	if !ok {
		return nil, fmt.Errorf("helm returned a %T, not a release", r)
	}
	return rel, nil
}

func ptrString(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func loadChart(t *testing.T) *chartv2.Chart {
	t.Helper()
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

// manifestObjects decodes the objects of a release's manifest.
func manifestObjects(t *testing.T, rel *releasev1.Release) []*unstructured.Unstructured {
	t.Helper()
	objs, err := decode(rel.Manifest)
	if err != nil {
		t.Fatalf("release manifest: %v", err)
	}
	return objs
}

// present returns, for each object, whether the apiserver has it.
func present(t *testing.T, k *testenv.Kube, objs []*unstructured.Unstructured) map[string]bool {
	t.Helper()
	a := newApplier(t, k.Config)
	out := map[string]bool{}
	for _, o := range objs {
		gvk := o.GroupVersionKind()
		mapping, err := a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			t.Fatalf("%s: %v", gvk, err)
		}
		var res dynamic.ResourceInterface = a.dyn.Resource(mapping.Resource)
		if mapping.Scope.Name() == "namespace" {
			res = a.dyn.Resource(mapping.Resource).Namespace(o.GetNamespace())
		}
		_, err = res.Get(context.Background(), o.GetName(), metav1.GetOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
		out[objectName(o)] = err == nil
	}
	return out
}

func objectName(o *unstructured.Unstructured) string {
	if o.GetNamespace() == "" {
		return o.GetKind() + " " + o.GetName()
	}
	return o.GetKind() + " " + o.GetNamespace() + "/" + o.GetName()
}

// catalogJobs lists the catalog Jobs of namespace ns, by name.
func catalogJobs(t *testing.T, k *testenv.Kube, ns string) []string {
	t.Helper()
	jobs, err := k.Client.BatchV1().Jobs(ns).List(context.Background(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=catalog"})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, j := range jobs.Items {
		if j.DeletionTimestamp == nil {
			names = append(names, j.Name)
		}
	}
	slices.Sort(names)
	return names
}

func jobOf(objs []*unstructured.Unstructured) *unstructured.Unstructured {
	for _, o := range objs {
		if o.GetKind() == "Job" {
			return o
		}
	}
	return nil
}

// wantInstalled checks that every object of the release exists, and that
// the release is deployed at version.
func wantInstalled(t *testing.T, k *testenv.Kube, rel *releasev1.Release, version int) []*unstructured.Unstructured {
	t.Helper()
	if rel.Info.Status != releasecommon.StatusDeployed || rel.Version != version {
		t.Fatalf("release %s version %d, want deployed version %d", rel.Info.Status, rel.Version, version)
	}
	objs := manifestObjects(t, rel)
	for name, ok := range present(t, k, objs) {
		if !ok {
			t.Errorf("%s of the release is not in the cluster", name)
		}
	}
	return objs
}

// TestHelmLifecycle drives the chart with Helm's own action library against
// the envtest apiserver: install of the defaults and of each variant, then,
// on one release, a sequence of upgrades that each change a value shaping
// the catalog Job's pod (which Kubernetes refuses to change in place), a
// rollback and an uninstall, as the README's deploy and upgrade sections
// say.
func TestHelmLifecycle(t *testing.T) {
	k := apiserver(t)

	t.Run("install-variants", func(t *testing.T) {
		for _, v := range variants {
			t.Run(v.name, func(t *testing.T) {
				ns := "life-" + v.name
				for _, n := range append([]string{ns, "sylva-system"}, v.namespaces...) {
					ensureNamespace(t, k, n, nil)
				}
				vals, err := LoadValues([]byte(v.values))
				if err != nil {
					t.Fatal(err)
				}
				h := newHelm(t, k, ns)
				rel, err := h.install(vals)
				if err != nil {
					t.Fatalf("helm install: %v", err)
				}
				objs := wantInstalled(t, k, rel, 1)
				// An upgrade with the same values changes nothing and is
				// accepted.
				rel, err = h.upgrade(vals)
				if err != nil {
					t.Fatalf("helm upgrade with the same values: %v", err)
				}
				wantInstalled(t, k, rel, 2)
				if err := h.uninstall(); err != nil {
					t.Fatalf("helm uninstall: %v", err)
				}
				for _, o := range objs {
					kept := o.GetAnnotations()["helm.sh/resource-policy"] == "keep"
					if gone := !present(t, k, []*unstructured.Unstructured{o})[objectName(o)]; gone == kept {
						t.Errorf("%s after uninstall: present %v, want %v (resource-policy keep: %v)", objectName(o), !gone, kept, kept)
					}
				}
			})
		}
	})

	// A StatefulSet's volumeClaimTemplates cannot change: an upgrade that
	// changes the data volume failed as "field is immutable" and left a
	// failed revision. The chart refuses it before anything is applied,
	// with the steps, and the steps work.
	t.Run("data-volume-change", func(t *testing.T) {
		const ns = "life-volume"
		ensureNamespace(t, k, ns, nil)
		h := newHelm(t, k, ns)
		volume := func(persistence string) map[string]any {
			vals, err := values.Parse([]byte("osImagePersistenceDefaults: " + persistence))
			if err != nil {
				t.Fatal(err)
			}
			return vals
		}
		claim := func() map[string]any {
			sts, err := k.Client.AppsV1().StatefulSets(ns).Get(context.Background(), "osimages-server", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			c := sts.Spec.VolumeClaimTemplates[0].Spec
			return map[string]any{"size": c.Resources.Requests.Storage().String(), "class": ptrString(c.StorageClassName), "modes": fmt.Sprint(c.AccessModes)}
		}
		if _, err := h.install(volume("{size: 30Gi}")); err != nil {
			t.Fatalf("helm install: %v", err)
		}
		// The same size in another unit is no change.
		rel, err := h.upgrade(volume("{size: 30720Mi}"))
		if err != nil {
			t.Fatalf("helm upgrade to the same size written 30720Mi: %v", err)
		}
		wantInstalled(t, k, rel, 2)

		for _, change := range []struct{ values, says string }{
			{"{size: 50Gi}", "(size 30Gi -> 50Gi)"},
			{`{size: 30Gi, storageClass: fast}`, `(storageClass "" -> "fast")`},
			{"{size: 30Gi, accessModes: [ReadWriteOncePod]}", `(accessModes ["ReadWriteOnce"] -> ["ReadWriteOncePod"])`},
		} {
			_, err := h.upgrade(volume(change.values))
			if err == nil || !contains(err.Error(), change.says, "this upgrade is refused, nothing was changed",
				"kubectl -n life-volume delete statefulset osimages-server --cascade=orphan", "Changing the data volume") {
				t.Errorf("helm upgrade to %s: %v; want a refusal saying %s and the steps", change.values, err, change.says)
			}
		}
		// Refused before anything was applied: no failed revision, the
		// release and its StatefulSet as they were.
		history, err := action.NewHistory(h.cfg).Run("osimages")
		if err != nil {
			t.Fatal(err)
		}
		if len(history) != 2 {
			t.Errorf("%d revisions after the refusals, want the 2 deployed ones", len(history))
		}
		if cur := h.current(); cur.Version != 2 || cur.Info.Status != releasecommon.StatusDeployed {
			t.Errorf("the release is at version %d, %s; want 2, deployed", cur.Version, cur.Info.Status)
		}
		if got := claim(); got["size"] != "30Gi" || got["class"] != "" {
			t.Errorf("the data volume changed: %v", got)
		}

		// The README's steps: orphan the StatefulSet (its pods would keep
		// running), upgrade.
		orphan := metav1.DeletePropagationOrphan
		if err := k.Client.AppsV1().StatefulSets(ns).Delete(context.Background(), "osimages-server", metav1.DeleteOptions{PropagationPolicy: &orphan}); err != nil {
			t.Fatal(err)
		}
		// The orphan finalizer is the garbage collector's to remove, once
		// it has orphaned the pods; envtest runs no garbage collector and
		// has no pods: do its part.
		if _, err := k.Client.AppsV1().StatefulSets(ns).Patch(context.Background(), "osimages-server", types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
		testenv.Eventually(t, "the StatefulSet gone", 30*time.Second, func() (bool, string) {
			_, err := k.Client.AppsV1().StatefulSets(ns).Get(context.Background(), "osimages-server", metav1.GetOptions{})
			return apierrors.IsNotFound(err), fmt.Sprint(err)
		})
		rel, err = h.upgrade(volume("{size: 50Gi, storageClass: fast}"))
		if err != nil {
			t.Fatalf("helm upgrade after orphaning the StatefulSet: %v", err)
		}
		wantInstalled(t, k, rel, 3)
		if got := claim(); got["size"] != "50Gi" || got["class"] != "fast" {
			t.Errorf("the data volume after the steps: %v", got)
		}
		if err := h.uninstall(); err != nil {
			t.Fatalf("helm uninstall: %v", err)
		}
	})

	t.Run("upgrades-rollback-uninstall", func(t *testing.T) {
		const ns = "life"
		ensureNamespace(t, k, ns, nil)
		h := newHelm(t, k, ns)
		base := `
os_image_selectors:
- {os: ubuntu, hardened: false}
cluster: {k8s_version: v1.32.5+rke2r1, capi_providers: {bootstrap_provider: cabpr}}
catalogJob:
  enabled: true
  values:
    os_images_oci_registries:
      sylva: {url: oci://registry.example.org/sylva/diskimage-builder, tag: 0.7.6}
    sylva_diskimagebuilder_images:
      ubuntu-noble-plain-rke2-1-32: {os_images_oci_registry: sylva}
`
		// Each step is applied over the ones before it. jobChanges says
		// whether the step changes the catalog Job's pod (or what it
		// reads), so that it must run again under a new name.
		steps := []struct {
			name, values string
			jobChanges   bool
		}{
			{"proxies", `proxies: {http_proxy: "http://proxy.example.org:3128", https_proxy: "http://proxy.example.org:3128", no_proxy: ".svc,.cluster.local"}`, true},
			{"catalog Job resources", `catalogJob: {resources: {requests: {cpu: 100m, memory: 128Mi}, limits: {memory: 512Mi}}}`, true},
			{"registry CA", "oci_registry_extra_ca_certs: |\n" + indent(testCA, "  "), true},
			{"registry credentials", `registryCredentialsSecret: registry-credentials`, true},
			{"image pull secrets", `imagePullSecrets: [{name: pull-secret}]`, true},
			{"security contexts", `{podSecurityContext: {runAsUser: 65533, runAsGroup: 65533, fsGroup: 65533, runAsNonRoot: true, seccompProfile: {type: RuntimeDefault}}, securityContext: {allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, runAsNonRoot: true, capabilities: {drop: [ALL]}, seLinuxOptions: {level: "s0:c1,c2"}}}`, true},
			{"image tag", `image: {tag: "0.1.1"}`, true},
			{"catalog values", `catalogJob: {values: {sylva_diskimagebuilder_images: {ubuntu-noble-hardened-rke2-1-32: {os_images_oci_registry: sylva}}}}`, true},
			{"finished Jobs kept an hour", `catalogJob: {ttlSecondsAfterFinished: 3600}`, true},
			{"server TLS behind an Ingress", `{server: {tlsSecret: os-image-server-tls}, ingress: {enabled: true, className: nginx, host: os-images.example.org, tls: {enabled: true, secretName: os-image-server-tls}}}`, false},
			{"monitoring", `monitoring: {serviceMonitor: {enabled: true}, prometheusRule: {enabled: true}, grafanaDashboard: {enabled: true}}`, false},
			{"three controllers", `controller: {replicas: 3, pdb: {minAvailable: 2}}`, false},
			{"three servers", `server: {replicas: 3}`, false},
			{"another copy name", `propagation: {target: osimages-served-images}`, false},
		}
		cur, err := values.Parse([]byte(base))
		if err != nil {
			t.Fatal(err)
		}
		rel, err := h.install(cur)
		if err != nil {
			t.Fatalf("helm install: %v", err)
		}
		first := wantInstalled(t, k, rel, 1)
		jobs := []string{jobOf(first).GetName()}
		if got := catalogJobs(t, k, ns); !slices.Equal(got, jobs[:1]) {
			t.Fatalf("catalog Jobs %v after install, want %v", got, jobs[:1])
		}
		for i, step := range steps {
			over, err := values.Parse([]byte(step.values))
			if err != nil {
				t.Fatalf("step %s: %v", step.name, err)
			}
			cur = values.Merge(cur, over)
			rel, err := h.upgrade(cur)
			if err != nil {
				t.Fatalf("helm upgrade (%s): %v", step.name, err)
			}
			objs := wantInstalled(t, k, rel, i+2)
			job := jobOf(objs).GetName()
			if changed := job != jobs[len(jobs)-1]; changed != step.jobChanges {
				t.Errorf("%s: the catalog Job's name changed: %v, want %v (%s -> %s)", step.name, changed, step.jobChanges, jobs[len(jobs)-1], job)
			}
			jobs = append(jobs, job)
			// Helm deleted the Job of the values before: one Job only.
			if got := catalogJobs(t, k, ns); !slices.Equal(got, []string{job}) {
				t.Errorf("%s: catalog Jobs %v, want only %s", step.name, got, job)
			}
		}
		last := manifestObjects(t, h.current())
		later := func(kind string) *unstructured.Unstructured {
			for _, o := range last {
				if o.GetKind() == kind {
					return o
				}
			}
			t.Fatalf("the last release has no %s", kind)
			return nil
		}
		ingress, rule := later("Ingress"), later("PrometheusRule")

		if err := h.rollback(1); err != nil {
			t.Fatalf("helm rollback to 1: %v", err)
		}
		rel = h.current()
		wantInstalled(t, k, rel, len(steps)+2)
		if got := catalogJobs(t, k, ns); !slices.Equal(got, jobs[:1]) {
			t.Errorf("catalog Jobs %v after the rollback, want the first release's %v", got, jobs[:1])
		}
		for name, ok := range present(t, k, []*unstructured.Unstructured{ingress, rule}) {
			if ok {
				t.Errorf("%s is still there after the rollback to a release without it", name)
			}
		}

		if err := h.uninstall(); err != nil {
			t.Fatalf("helm uninstall: %v", err)
		}
		if got := catalogJobs(t, k, ns); len(got) != 0 {
			t.Errorf("catalog Jobs %v after uninstall", got)
		}
		for _, name := range []string{"os-images-info", "capm3-os-image-server-os-images"} {
			if _, err := k.Client.CoreV1().ConfigMaps(ns).Get(context.Background(), name, metav1.GetOptions{}); err != nil {
				t.Errorf("ConfigMap %s, kept on uninstall: %v", name, err)
			}
		}
		secrets, err := k.Client.CoreV1().Secrets(ns).List(context.Background(), metav1.ListOptions{LabelSelector: "owner=helm"})
		if err != nil || len(secrets.Items) != 0 {
			t.Errorf("release records left after uninstall: %v %d", err, len(secrets.Items))
		}
		t.Logf("%d upgrades, rollback and uninstall; catalog Jobs by revision: %s", len(steps), strings.Join(jobs, " "))
	})
}
