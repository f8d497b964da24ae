package testenv

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/manager"
)

// Suite is the apiserver of one package's tests, as a suite_test.go
// declares it: started by the first test that asks for it (a package's
// pure tests run without one), shared by the others, and stopped by
// Run when they are done.
//
//	var suite = testenv.NewSuite(testenv.WithMetal3CRDs)
//
//	func TestMain(m *testing.M) { os.Exit(suite.Run(m)) }
//
//	func TestX(t *testing.T) { k := suite.Kube(t); ... }
type Suite struct {
	crds func() ([]string, error)

	once sync.Once
	kube *Kube
	err  error
}

// NewSuite returns a suite whose apiserver gets the CRD folders crds
// returns (nil: none).
func NewSuite(crds func() ([]string, error)) *Suite {
	if crds == nil {
		crds = func() ([]string, error) { return nil, nil }
	}
	return &Suite{crds: crds}
}

// WithMetal3CRDs installs the real Metal3 CRDs when shared/ has them, and
// the stand-ins of internal/testenv/crds otherwise, but where
// RequireAllEnv is set: there the suite fails without the real ones.
func WithMetal3CRDs() ([]string, error) {
	dir, real := Metal3CRDsOrStandIn()
	if !real && Required() {
		return nil, errNoRealMetal3CRDs
	}
	return []string{dir}, nil
}

// errNoRealMetal3CRDs is the stand-ins refused where RequireAllEnv is set.
var errNoRealMetal3CRDs = fmt.Errorf("shared/ has no crds/metal3 (set OSIMAGES_SHARED_DIR), and %s is set: the tests must run against the real Metal3 CRDs, not the stand-ins", RequireAllEnv)

// Kube returns the suite's apiserver, started on first use; a failure to
// start it fails every test that asks.
func (s *Suite) Kube(t testing.TB) *Kube {
	t.Helper()
	s.once.Do(func() {
		crds, err := s.crds()
		if err != nil {
			s.err = err
			return
		}
		start := time.Now()
		s.kube, s.err = StartKube(crds...)
		if s.err == nil && testing.Verbose() {
			fmt.Fprintf(os.Stderr, "envtest with %d CRD folders started in %s\n", len(crds), time.Since(start).Round(time.Millisecond))
		}
	})
	if s.err != nil {
		t.Fatal(s.err)
	}
	return s.kube
}

// Started says whether a test started the apiserver.
func (s *Suite) Started() bool { return s.kube != nil }

// Run runs the package's tests, then stops the apiserver if one was
// started; its result is the exit code.
func (s *Suite) Run(m *testing.M) int {
	code := m.Run()
	if s.kube != nil {
		if err := s.kube.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stopping envtest:", err)
		}
	}
	return code
}

// Namespace creates a namespace with these labels; it fails the test when
// it exists already, so that tests never share one by accident.
func (k *Kube) Namespace(t testing.TB, name string, labels map[string]string) {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
	if _, err := k.Client.CoreV1().Namespaces().Create(context.Background(), ns, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating namespace %s: %v", name, err)
	}
}

// StartManager runs a controller-runtime manager until the test ends, or
// until the stop it returns is called (a replica that goes away): stop
// waits for the manager, and a manager that failed fails the test.
func StartManager(t testing.TB, mgr manager.Manager) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("the manager stopped with: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// Succeeds polls f until it returns nil, or fails the test when timeout
// has passed, with the last error.
func Succeeds(t testing.TB, what string, timeout time.Duration, f func() error) {
	t.Helper()
	Eventually(t, what, timeout, func() (bool, string) {
		err := f()
		return err == nil, fmt.Sprint(err)
	})
}

// KubeWithoutMetal3 starts an apiserver of the test's own, without the
// Metal3 CRDs, for a test of a capm3 installed while osimages runs (a
// suite's apiserver has them from the start); installMetal3 adds the real
// CRDs from shared/, or the stand-ins when shared/ has none.
func KubeWithoutMetal3(t testing.TB) (k *Kube, installMetal3 func()) {
	t.Helper()
	crds, real := Metal3CRDsOrStandIn()
	if !real && Required() {
		t.Fatal(errNoRealMetal3CRDs)
	}
	if !real {
		t.Log("shared/ has no Metal3 CRDs: installing the stand-ins of internal/testenv/crds")
	}
	k, err := StartKube()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k.Stop() })
	return k, func() {
		t.Helper()
		if _, err := envtest.InstallCRDs(k.Config, envtest.CRDInstallOptions{Paths: []string{crds}, ErrorIfPathMissing: true}); err != nil {
			t.Fatal(err)
		}
	}
}
