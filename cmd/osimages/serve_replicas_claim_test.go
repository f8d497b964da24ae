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
	"github.com/sylva-projects/osimages/internal/fill"
	"github.com/sylva-projects/osimages/internal/replica"
	"github.com/sylva-projects/osimages/internal/testenv"
)

// TestServeReplicasStartedTogetherPullOnce: three replicas started
// together while the catalog already selects the images, before any of
// them has an endpoint (pods without an address yet, as a Parallel
// StatefulSet, a node restart or a rollout of every pod gives): each first
// lists nobody. None claims a download until it lists the 3 replicas that
// --replicas expects; then one pulls each image and the others follow it.
// Before, a first listing of nobody counted as a set that had settled: each
// replica claimed at once, alone, and the registry sent each image three
// times.
func TestServeReplicasStartedTogetherPullOnce(t *testing.T) {
	counter := &blobCounter{}
	counter.trickle.Store(true)
	reg := testenv.Registry(t, devregistry.Options{Middleware: counter.middleware})
	args, sums, blobBytes := replicaImages(t, reg, 6<<20)
	// A claim wait far beyond the test: only listing the 3 replicas lets
	// one claim.
	rs := newReplicaSet(t, append(args, "--replicas", "3", "--claim-wait", "10m")...)
	ids := []string{"r0", "r1", "r2"}
	for _, id := range ids {
		rs.startListed(false, id, nil)
	}
	// Every replica has read the selection and its (empty) endpoints.
	testenv.Eventually(t, "every replica answers with the selected images", 60*time.Second, func() (bool, string) {
		for _, id := range ids {
			st := rs.get(id).state()
			if st == nil || len(st.Images) < len(sums) {
				return false, id + ": " + fmt.Sprint(st)
			}
		}
		return true, ""
	})
	// Each replica's listing settled and it decided, listing nobody, to
	// wait for the others: had it claimed, it would have done so by then.
	testenv.Eventually(t, "every replica waits for the replicas expected", 60*time.Second, func() (bool, string) {
		for _, id := range ids {
			if !strings.Contains(rs.get(id).d.stderr.String(), "no download is claimed until the replicas expected are listed") {
				return false, id + ": " + rs.get(id).d.stderr.String()
			}
		}
		return true, ""
	})
	for _, id := range ids {
		for sum, img := range rs.get(id).state().Images {
			if img.Source == fill.FromRegistry {
				t.Errorf("%s claimed the registry pull of %s while it listed nobody: %+v", id, sum[:12], img)
			}
		}
	}
	if sent := counter.sent.Load(); sent != 0 {
		t.Errorf("the registry sent %d blob bytes before the replicas listed each other", sent)
	}
	for _, id := range ids {
		rs.get(id).unlisted.Store(false)
	}
	rs.waitHold(ids, sums...)
	t.Logf("the registry sent %d blob bytes for blobs of %d (%.2f×)", counter.sent.Load(), blobBytes, float64(counter.sent.Load())/float64(blobBytes))
	if sent := counter.sent.Load(); sent < blobBytes || float64(sent) > 1.05*float64(blobBytes) {
		t.Errorf("the registry sent %d blob bytes for blobs of %d in all (%.2f×): want each once", sent, blobBytes, float64(sent)/float64(blobBytes))
	}
	for _, id := range ids {
		for _, s := range sums {
			t.Logf("%s holds %s from %s", id, s[:12], rs.get(id).state().Images[s].Source)
		}
	}
}

// TestServeReplicasRestartEveryPodMidFill: the three replicas killed at
// once (SIGKILL) while the registry sends half of a gzip layer, and
// started again on their volumes without an endpoint at first (new pods
// have no address yet). Once they list each other, one continues the
// layer from its checkpoint and the others follow it from theirs: the
// registry sends the layer about once, plus at most what the killed
// puller had received past its last checkpoint (2 MiB, the puller's
// checkpoint step). Before, each replica listed nobody at its restart and
// continued its own part from the registry.
func TestServeReplicasRestartEveryPodMidFill(t *testing.T) {
	counter := &blobCounter{}
	counter.trickle.Store(true)
	reg := testenv.Registry(t, devregistry.Options{Middleware: counter.middleware})
	args, sums, _ := replicaImages(t, reg, 48<<20)
	gzSum, layer, layerDigest := gzipLayer(t, reg)
	ids := []string{"r0", "r1", "r2"}
	origin := replica.Rendezvous(gzSum.String(), ids)[0]
	rs := newReplicaSet(t, append(args, "--replicas", "3")...)
	data := map[string]string{}
	for _, id := range ids {
		data[id] = t.TempDir()
		rs.start(id, nil, "--data", data[id])
	}
	testenv.Eventually(t, "the layer half sent", 90*time.Second, func() (bool, string) {
		return counter.sentOf(layerDigest) >= layer/2, fmt.Sprint(rs.get(origin).state())
	})
	for _, id := range ids {
		rs.get(id).d.kill(syscall.SIGKILL)
		// The pods are gone, and their endpoints with them.
		rs.get(id).removed.Store(true)
	}
	testenv.Eventually(t, "the endpoints of the killed replicas gone", 30*time.Second, func() (bool, string) {
		l, err := rs.k.Client.DiscoveryV1().EndpointSlices(rs.ns).List(context.Background(), metav1.ListOptions{})
		return err == nil && len(l.Items) == 0, fmt.Sprint(l, err)
	})
	before := counter.sentOf(layerDigest)
	for _, id := range ids {
		rs.startListed(false, id, nil, "--data", data[id])
	}
	time.Sleep(time.Second)
	for _, id := range ids {
		rs.get(id).unlisted.Store(false)
	}
	rs.waitHold(ids, sums...)
	sent := counter.sentOf(layerDigest)
	t.Logf("the registry sent %d bytes of the layer's %d before the kill, %d in all (%.2f×)", before, layer, sent, float64(sent)/float64(layer))
	if float64(sent) > 1.05*float64(layer)+2<<20 {
		t.Errorf("the registry sent %d bytes of the layer's %d (%.2f×): the restart did not continue what was kept", sent, layer, float64(sent)/float64(layer))
	}
	// One registry pull after the restart, the others following it.
	for _, id := range ids {
		src := rs.get(id).state().Images[gzSum].Source
		switch {
		case id == origin && src != fill.FromRegistry:
			t.Errorf("%s, first in rendezvous order, filled the gz image from %q after the restart, want the registry", id, src)
		case id != origin && src != fill.FromPeerPrefix+origin:
			t.Errorf("%s filled the gz image from %q after the restart, want peer %s", id, src, origin)
		case id != origin && !continued(rs.get(id).d.stderr.String(), gzSum, src):
			t.Errorf("%s did not continue the layer from what it kept", id)
		}
	}
}
