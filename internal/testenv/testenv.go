// Package testenv starts the real components tests run against: a
// kube-apiserver and etcd through controller-runtime's envtest, and an OCI
// registry on 127.0.0.1.
package testenv

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	crlog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/sylva-projects/osimages/internal/devregistry"
)

// Kube is a running kube-apiserver with etcd.
type Kube struct {
	Env *envtest.Environment
	// Config is an admin client config.
	Config *rest.Config
	// Kubeconfig is the path of an admin kubeconfig file, for the CLI.
	Kubeconfig string
	Client     kubernetes.Interface
	dir        string
}

// StartKube starts envtest with the binaries found in KUBEBUILDER_ASSETS,
// which hack/tools.sh builds. CRD folders, when given, are installed. Call
// Stop when done (typically from TestMain).
func StartKube(crdPaths ...string) (*Kube, error) {
	assets := os.Getenv("KUBEBUILDER_ASSETS")
	if assets == "" {
		return nil, fmt.Errorf("KUBEBUILDER_ASSETS is not set: run the tests with `make test`, or `eval \"$(hack/tools.sh env)\"` first, to build kube-apiserver and etcd")
	}
	if _, err := os.Stat(filepath.Join(assets, "kube-apiserver")); err != nil {
		return nil, fmt.Errorf("KUBEBUILDER_ASSETS=%s holds no kube-apiserver: run hack/tools.sh", assets)
	}
	// controller-runtime complains once per process when no logger is set.
	crlog.SetLogger(logr.Discard())
	env := &envtest.Environment{
		BinaryAssetsDirectory: assets,
		CRDDirectoryPaths:     crdPaths,
		ErrorIfCRDPathMissing: true,
		// On 2 busy cores kube-apiserver can take far longer than envtest's
		// default 20 s to become ready.
		ControlPlaneStartTimeout: 3 * time.Minute,
		ControlPlaneStopTimeout:  time.Minute,
	}
	cfg, err := env.Start()
	if err != nil {
		return nil, fmt.Errorf("starting envtest: %w", err)
	}
	k := &Kube{Env: env, Config: cfg}
	fail := func(err error) (*Kube, error) {
		_ = k.Stop()
		return nil, err
	}
	user, err := env.AddUser(envtest.User{Name: "osimages-admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return fail(err)
	}
	kc, err := user.KubeConfig()
	if err != nil {
		return fail(err)
	}
	if k.dir, err = os.MkdirTemp("", "osimages-envtest-"); err != nil {
		return fail(err)
	}
	k.Kubeconfig = filepath.Join(k.dir, "kubeconfig")
	if err := os.WriteFile(k.Kubeconfig, kc, 0o600); err != nil {
		return fail(err)
	}
	if k.Client, err = kubernetes.NewForConfig(cfg); err != nil {
		return fail(err)
	}
	return k, nil
}

// Stop stops the apiserver and etcd and removes their files.
func (k *Kube) Stop() error {
	if k.dir != "" {
		os.RemoveAll(k.dir)
	}
	return k.Env.Stop()
}

// Registry starts an OCI registry on 127.0.0.1 for the length of the test.
func Registry(t testing.TB, opts devregistry.Options) *devregistry.Registry {
	t.Helper()
	reg, err := devregistry.Start(context.Background(), opts)
	if err != nil {
		t.Fatalf("starting registry: %v", err)
	}
	t.Cleanup(func() { reg.Close() })
	return reg
}

// Signer returns a fresh cosign key pair, as `cosign generate-key-pair`
// makes.
func Signer(t testing.TB) *devregistry.Signer {
	t.Helper()
	s, err := devregistry.NewSigner()
	if err != nil {
		t.Fatalf("making a signing key: %v", err)
	}
	return s
}

// Sign signs a published artifact with s and pushes the signature beside
// it, as `cosign sign --key` does.
func Sign(t testing.TB, reg *devregistry.Registry, s *devregistry.Signer, p devregistry.Published, opts devregistry.SignOptions) {
	t.Helper()
	if err := reg.Sign(context.Background(), s, p.Repository, p.ManifestDigest, opts); err != nil {
		t.Fatalf("signing %s: %v", p.Ref, err)
	}
}

// Eventually polls cond until it holds, or fails the test when timeout
// has passed, with what and the last state cond described.
func Eventually(t testing.TB, what string, timeout time.Duration, cond func() (ok bool, state string)) {
	t.Helper()
	Poll(t, what, timeout, 50*time.Millisecond, cond)
}

// Poll is Eventually polling every interval: a condition that is costly
// to test (a list of a whole fleet, in a benchmark) is tested less often.
func Poll(t testing.TB, what string, timeout, interval time.Duration, cond func() (ok bool, state string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	last := ""
	for time.Now().Before(deadline) {
		ok, state := cond()
		if ok {
			return
		}
		last = state
		time.Sleep(interval)
	}
	t.Fatalf("%s: not within %s; last: %s", what, timeout, last)
}

// SharedDir returns the read-only shared/ folder of fixtures that sits beside
// the checkout (or $OSIMAGES_SHARED_DIR), or ends the test through Missing,
// saying why: the project must build and test without it, and CI with it.
func SharedDir(t testing.TB) string {
	t.Helper()
	if dir := os.Getenv("OSIMAGES_SHARED_DIR"); dir != "" {
		return dir
	}
	if dir := findSharedDir(); dir != "" {
		return dir
	}
	Missing(t, "shared/ fixtures not found beside the checkout (set OSIMAGES_SHARED_DIR): skipping the checks that need them")
	return ""
}

// Metal3CRDs returns the folder of the real Metal3 CRDs in shared/, or "" when
// it is absent.
func Metal3CRDs() string {
	dir := os.Getenv("OSIMAGES_SHARED_DIR")
	if dir == "" {
		dir = findSharedDir()
	}
	if dir == "" {
		return ""
	}
	crds := filepath.Join(dir, "crds", "metal3")
	if _, err := os.Stat(crds); err != nil {
		return ""
	}
	return crds
}

// Metal3CRDsOrStandIn returns the real Metal3 CRDs when shared/ has them,
// and otherwise stand-ins for the two kinds that reference images, so that
// the tests of image references run everywhere. The second result says
// which.
func Metal3CRDsOrStandIn() (dir string, real bool) {
	if dir := Metal3CRDs(); dir != "" {
		return dir, true
	}
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "crds"), false
}

func findSharedDir() string {
	dir, err := os.Getwd()
	if err != nil {
		return ""
	}
	for {
		if fi, err := os.Stat(filepath.Join(dir, "shared", "crds")); err == nil && fi.IsDir() {
			return filepath.Join(dir, "shared")
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return ""
		}
		dir = parent
	}
}
