//go:build e2e

package e2e

import (
	"path/filepath"
	"testing"
	"time"
)

// suite is the state the scenarios hand on to each other: they run in
// order on one release, as an operator's day does (install, scale out,
// the fleet, the runtime's checks, operations, uninstall).
type suite struct {
	reg  *registry
	helm *helm
	vals values
	// url is the image server's base URL, as render writes it.
	url string
}

// TestE2E runs the scenarios of issue 24 in order; one that fails stops
// the ones after it, which stand on what it set up.
func TestE2E(t *testing.T) {
	s := &suite{}
	start := time.Now()
	// The pods' logs outlive the pods (make e2e keeps the cluster's logs).
	keepLogs(t, filepath.Join(env.dir, "logs", "pods"), releaseNS, registryNS, clientNS)
	for _, sc := range []struct {
		name string
		run  func(*testing.T)
	}{
		{"Install", s.install},
		{"Replicas", s.replicas},
		{"Controller", s.controller},
		{"Runtime", s.runtime},
		{"Operations", s.operations},
	} {
		began := time.Now()
		ran := false
		ok := t.Run(sc.name, func(t *testing.T) { ran = true; sc.run(t) })
		if !ran {
			continue // left out by -run
		}
		t.Logf("scenario %s: %s in %.0f s", sc.name, map[bool]string{true: "passed", false: "FAILED"}[ok], time.Since(began).Seconds())
		if !ok {
			t.Fatalf("scenario %s failed: the later ones stand on it and do not run", sc.name)
		}
	}
	t.Logf("every scenario passed in %.0f s", time.Since(start).Seconds())
}
