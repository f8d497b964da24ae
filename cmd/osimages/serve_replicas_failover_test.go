package main

import (
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sylva-projects/osimages/internal/devregistry"
	"github.com/sylva-projects/osimages/internal/fill"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/replica"
	"github.com/sylva-projects/osimages/internal/testenv"
)

// TestServeReplicasFailOverKeepsTheLayer: the replica pulling a gzip layer
// from the registry, followed by the two others, is killed (SIGKILL) half
// way through the layer. The next in rendezvous order continues the layer
// from what it had streamed (its checkpoint, the same as after a restart),
// and the third keeps following the layer from it, from its own
// checkpoint. Before, the next pulled the layer again from byte 0 and the
// third copied the raw image: registry egress 1.60×.
func TestServeReplicasFailOverKeepsTheLayer(t *testing.T) {
	counter := &blobCounter{}
	counter.trickle.Store(true)
	reg := testenv.Registry(t, devregistry.Options{Middleware: counter.middleware})
	args, sums, blobBytes := replicaImages(t, reg, 24<<20)
	gzSum, layer, layerDigest := gzipLayer(t, reg)
	ids := []string{"r0", "r1", "r2"}
	order := replica.Rendezvous(gzSum.String(), ids)
	origin, next, third := order[0], order[1], order[2]
	rs := newReplicaSet(t, append(args, "--replicas", "3")...)
	start := time.Now()
	for _, id := range ids {
		rs.start(id, nil)
	}
	testenv.Eventually(t, "the origin half way through the layer, followed by the others", 90*time.Second, func() (bool, string) {
		o := rs.get(origin).state()
		if o == nil {
			return false, "the origin does not answer"
		}
		img := o.Images[gzSum]
		if img.Source != fill.FromRegistry || img.Received < layer/2 || counter.sentOf(layerDigest) < layer/2 {
			return false, fmt.Sprintf("origin: %+v", img)
		}
		for _, id := range []string{next, third} {
			st := rs.get(id).state()
			if st == nil || st.Images[gzSum].Source != fill.FromPeerPrefix+origin || st.Images[gzSum].Received == 0 {
				return false, fmt.Sprintf("%s: %v", id, st)
			}
		}
		return true, ""
	})
	sentBefore := counter.sentOf(layerDigest)
	rs.get(origin).d.kill(syscall.SIGKILL)
	killed := time.Now()
	t.Logf("killed %s at %s, the registry having sent %d bytes of the layer's %d", origin, killed.Sub(start).Round(time.Millisecond), sentBefore, layer)
	rest := []string{next, third}
	rs.waitHold(rest, sums...)
	held := time.Now()
	sent := counter.sentOf(layerDigest)
	t.Logf("the survivors hold every image %s after the start, %s after the kill; the registry sent %d bytes of the layer's %d (%.2f×), %d blob bytes in all for blobs of %d",
		held.Sub(start).Round(time.Millisecond), held.Sub(killed).Round(time.Millisecond), sent, layer, float64(sent)/float64(layer), counter.sent.Load(), blobBytes)
	for _, id := range rest {
		t.Logf("%s verified the gz image %s after the start", id, rs.get(id).state().Images[gzSum].VerifiedAt.Sub(start).Round(time.Millisecond))
	}
	if float64(sent) > 1.2*float64(layer) {
		t.Errorf("the registry sent %d bytes of the layer's %d (%.2f×): it was pulled again from byte 0", sent, layer, float64(sent)/float64(layer))
	}
	if float64(counter.sent.Load()) > 1.2*float64(blobBytes) {
		t.Errorf("the registry sent %d blob bytes for blobs of %d", counter.sent.Load(), blobBytes)
	}
	if src := rs.get(next).state().Images[gzSum].Source; src != fill.FromRegistry {
		t.Errorf("%s, next in order, filled the gz image from %q, want the registry", next, src)
	}
	if src := rs.get(third).state().Images[gzSum].Source; src != fill.FromPeerPrefix+next {
		t.Errorf("%s filled the gz image from %q, want peer %s", third, src, next)
	}
	// Each continued what it had received: its own checkpoint, from the
	// registry for the next, from the next's layer for the third.
	for id, source := range map[string]string{next: fill.FromRegistry, third: fill.FromPeerPrefix + next} {
		if !continued(rs.get(id).d.stderr.String(), gzSum, source) {
			t.Errorf("%s did not continue the layer from what it kept (source %s):\n%s", id, source, rs.get(id).d.stderr.String())
		}
	}
}

// continued says whether a replica's log says that it continued the
// download of sum from source from the bytes it kept.
func continued(logs string, sum osimage.SHA256, source string) bool {
	for _, line := range strings.Split(logs, "\n") {
		if strings.Contains(line, `"msg":"download continued from the partial file kept"`) && strings.Contains(line, string(sum)) &&
			strings.Contains(line, `"source":"`+source+`"`) && !strings.Contains(line, `"keptBytes":0`) {
			return true
		}
	}
	return false
}
