package main

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sylva-projects/osimages/internal/devregistry"
	"github.com/sylva-projects/osimages/internal/testenv"
)

// TestServeReplicasRestartKeepsWhatIsPublished: every replica of a set
// killed at once (a node that crashed, as make e2e's scenario Operations
// does it) and started again on its own volume. While none is ready, none
// can vouch for an image nor take one back: the output keeps saying
// available, instead of flapping to unavailable until the restarted
// replica's endpoint is ready again (which failed every render meanwhile).
func TestServeReplicasRestartKeepsWhatIsPublished(t *testing.T) {
	reg := testenv.Registry(t, devregistry.Options{})
	args, sums, _ := replicaImages(t, reg, 2<<20)
	rs := newReplicaSet(t, args...)
	out := rs.watchOutput()
	data := t.TempDir()
	rs.start("r0", nil, "--data", data)
	testenv.Eventually(t, "r0 holds every image, published available", 60*time.Second, func() (bool, string) {
		return rs.get("r0").holds(sums...) && allAvailable(out.last(), sums...), fmt.Sprint(out.last())
	})
	before := len(out.all())

	rs.get("r0").d.kill(syscall.SIGKILL)
	testenv.Eventually(t, "r0's endpoint not ready", 30*time.Second, func() (bool, string) {
		return !rs.endpointReady("r0"), "still ready"
	})
	r := rs.start("r0", nil, "--data", data)
	// Once the restarted r0 has published (the same document: no new
	// version then) and the watch has caught up with whatever it wrote
	// before, every version since the crash is in out.
	testenv.Eventually(t, "the restarted r0 ready and publishing", 60*time.Second, func() (bool, string) {
		return rs.endpointReady("r0") && strings.Contains(r.d.stderr.String(), `"msg":"served set published"`) && allAvailable(out.last(), sums...), r.d.stderr.String()
	})
	for _, o := range out.all()[before:] {
		if !allAvailable(o.set, sums...) {
			t.Errorf("after the restart, the output said %v at %s: a flap to unavailable", o.set, o.at.Format(time.StampMicro))
		}
	}
}

// endpointReady says whether replica id's endpoint is listed ready.
func (rs *replicaSet) endpointReady(id string) bool {
	sl, err := rs.k.Client.DiscoveryV1().EndpointSlices(rs.ns).Get(context.Background(), "osimages-"+id, metav1.GetOptions{})
	if err != nil || len(sl.Endpoints) == 0 {
		return false
	}
	c := sl.Endpoints[0].Conditions.Ready
	return c != nil && *c
}
