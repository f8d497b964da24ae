package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/sylva-projects/osimages/internal/testenv"
)

// The end-to-end tests drive the real binary, so that flags, exit codes and
// output streams are tested as operators meet them.
var binary string

// suite is one apiserver shared by the tests of this package, started on
// first use with the Metal3 CRDs when shared/ has them (their stand-ins
// otherwise).
var suite = testenv.NewSuite(testenv.WithMetal3CRDs)

// builtEnv passes the binary built outside to the run of the tests in their
// own network namespace, which has no network to build with.
const builtEnv = "OSIMAGES_TEST_BINARY"

func TestMain(m *testing.M) {
	if built := os.Getenv(builtEnv); built != "" {
		// The run inside the test binary's own network namespace: the
		// run outside built the binary and removes it.
		binary = built
		testenv.RunInOwnNetwork()
		os.Exit(suite.Run(m))
	}
	dir, err := os.MkdirTemp("", "osimages-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "osimages")
	build := exec.Command("go", "build", "-o", binary, ".")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building osimages:", err)
		os.Exit(1)
	}
	// The replica tests name their peers in EndpointSlices, with an
	// address (testenv.OwnNetwork) that may only exist in a network
	// namespace of this binary's own: the tests run there, on its
	// loopback, when the machine allows (root).
	code, ran := testenv.RunInOwnNetwork(builtEnv + "=" + binary)
	if !ran {
		code = suite.Run(m)
	}
	os.RemoveAll(dir)
	os.Exit(code)
}

func apiserver(t *testing.T) *testenv.Kube {
	t.Helper()
	return suite.Kube(t)
}

type result struct {
	code           int
	stdout, stderr string
}

func run(t *testing.T, args ...string) result {
	t.Helper()
	// Long enough for any command of the tests; a hung one fails its test
	// instead of the whole binary's timeout.
	return runFor(t, 10*time.Minute, args...)
}

func writeFile(t testing.TB, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
