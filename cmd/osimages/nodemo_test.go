package main

import (
	"errors"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The production build (-tags nodemo: the container image, make build)
// carries no registry: none of the packages that the demo's in-process
// registry brings may be linked into it.
func TestProductionBuildHasNoRegistry(t *testing.T) {
	list := func(tags ...string) []string {
		t.Helper()
		out, err := exec.Command("go", append(append([]string{"list", "-deps"}, tags...), ".")...).CombinedOutput()
		if err != nil {
			t.Fatalf("go list: %v\n%s", err, out)
		}
		return strings.Fields(string(out))
	}
	banned := regexp.MustCompile(`^(github\.com/distribution/|github\.com/redis/|github\.com/go-redis/|github\.com/sirupsen/logrus|golang\.org/x/crypto/bcrypt|go\.opentelemetry\.io/)|/internal/(devregistry|demo)$`)
	var found []string
	for _, pkg := range list("-tags", "nodemo") {
		if banned.MatchString(pkg) {
			found = append(found, pkg)
		}
	}
	if len(found) > 0 {
		t.Errorf("the nodemo build links %d packages of the demo's registry: %s", len(found), strings.Join(found, " "))
	}
	// The default build keeps the demo: the pattern must match there, or
	// this test proves nothing.
	matched := 0
	for _, pkg := range list() {
		if banned.MatchString(pkg) {
			matched++
		}
	}
	if matched == 0 {
		t.Error("the default build links no registry package: the pattern matches nothing, fix the test")
	}
}

// A nodemo binary asked for the demo says how to run it instead.
func TestNodemoDemoSaysHowToRunIt(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "osimages")
	if out, err := exec.Command("go", "build", "-tags", "nodemo", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build -tags nodemo: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "demo", "--once").CombinedOutput()
	var exitErr *exec.ExitError
	if !errors.As(err, &exitErr) || exitErr.ExitCode() != 1 {
		t.Fatalf("demo in a nodemo build: %v, want exit 1\n%s", err, out)
	}
	for _, want := range []string{"built without the demo", "go run ./cmd/osimages demo"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("demo in a nodemo build says %q, want it to say %q", out, want)
		}
	}
}
