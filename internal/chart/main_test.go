package chart

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/sylva-projects/osimages/internal/testenv"
)

const chartDir = "../../charts/osimages"

// binary is the osimages command the RBAC tests run as the chart's service
// accounts; built on first use.
var (
	binOnce sync.Once
	binary  string
	binErr  error
	binDir  string
)

// suite is one kube-apiserver for the package, with the Cluster API core
// CRDs from the sigs.k8s.io/cluster-api module, the Prometheus Operator's
// kinds (for the monitoring values) and the real Metal3 CRDs when shared/
// has them.
var suite = testenv.NewSuite(func() ([]string, error) {
	capi, err := testenv.ClusterAPICRDs()
	if err != nil {
		return nil, err
	}
	crds := []string{capi, "testdata/crds"}
	if dir := testenv.Metal3CRDs(); dir != "" {
		crds = append(crds, dir)
		metal3 = true
	} else if testenv.Required() {
		return nil, fmt.Errorf("shared/ has no crds/metal3 (set OSIMAGES_SHARED_DIR), and %s is set: the chart must be checked against the real Metal3 CRDs", testenv.RequireAllEnv)
	}
	return crds, nil
})

// metal3 tells whether the real Metal3 CRDs were installed.
var metal3 bool

func TestMain(m *testing.M) {
	code := suite.Run(m)
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

func osimagesBinary(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		if binDir, binErr = os.MkdirTemp("", "osimages-chart-"); binErr != nil {
			return
		}
		binary = filepath.Join(binDir, "osimages")
		out, err := exec.Command("go", "build", "-o", binary, "../../cmd/osimages").CombinedOutput()
		if err != nil {
			binErr = fmt.Errorf("building osimages: %v\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binary
}

func apiserver(t *testing.T) *testenv.Kube {
	t.Helper()
	return suite.Kube(t)
}

// applier applies unstructured objects with server-side apply.
type applier struct {
	dyn    dynamic.Interface
	mapper *restmapper.DeferredDiscoveryRESTMapper
}

func newApplier(t *testing.T, cfg *rest.Config) *applier {
	t.Helper()
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &applier{dyn: dyn, mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))}
}

// apply applies every object (a server-side dry run when dryRun) and returns
// every refusal, each naming its object.
func (a *applier) apply(ctx context.Context, objs []*unstructured.Unstructured, dryRun bool) error {
	var errs []error
	for _, obj := range objs {
		gvk := obj.GroupVersionKind()
		mapping, err := a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s %s: %w", gvk.Kind, obj.GetName(), err))
			continue
		}
		var res dynamic.ResourceInterface = a.dyn.Resource(mapping.Resource)
		if mapping.Scope.Name() == "namespace" {
			res = a.dyn.Resource(mapping.Resource).Namespace(obj.GetNamespace())
		}
		opts := metav1.ApplyOptions{FieldManager: "helm", Force: true}
		if dryRun {
			opts.DryRun = []string{metav1.DryRunAll}
		}
		if _, err := res.Apply(ctx, obj.GetName(), obj, opts); err != nil {
			errs = append(errs, fmt.Errorf("%s %s/%s: %w", gvk.Kind, obj.GetNamespace(), obj.GetName(), err))
		}
	}
	return errors.Join(errs...)
}

func ensureNamespace(t *testing.T, k *testenv.Kube, name string, labels map[string]string) {
	t.Helper()
	_, err := k.Client.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
	}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

// serviceAccountKubeconfig writes a kubeconfig that acts as the service
// account NS/NAME: the admin impersonates it, with the groups the apiserver
// gives service-account tokens, so that the account's own RBAC decides every
// request, as in a pod.
func serviceAccountKubeconfig(t *testing.T, k *testenv.Kube, ns, name string) (string, *rest.Config) {
	t.Helper()
	cfg, err := clientcmd.LoadFromFile(k.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, ai := range cfg.AuthInfos {
		ai.Impersonate = "system:serviceaccount:" + ns + ":" + name
		ai.ImpersonateGroups = []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"}
	}
	path := filepath.Join(t.TempDir(), name+".kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	rc, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		t.Fatal(err)
	}
	return path, rc
}

// wantForbidden fails unless err is the apiserver's Forbidden.
func wantForbidden(t *testing.T, what string, err error) {
	t.Helper()
	if !apierrors.IsForbidden(err) {
		t.Errorf("%s: got %v, want Forbidden", what, err)
	}
}

func wantAllowed(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil {
		t.Errorf("%s: %v", what, err)
	}
}

func contains(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}
