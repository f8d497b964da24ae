package main

import (
	"fmt"
	"testing"
	"time"

	"github.com/sylva-projects/osimages/internal/devregistry"
	"github.com/sylva-projects/osimages/internal/fill"
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
	rs := newReplicaSet(t, append(args, "--replicas", "3")...)
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
	// Long enough for a replica that lists nobody to have claimed (the
	// settle is 500 ms), far within the claim wait (10 s).
	time.Sleep(2 * time.Second)
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
