package main

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sylva-projects/osimages/internal/devregistry"
	"github.com/sylva-projects/osimages/internal/fill"
	"github.com/sylva-projects/osimages/internal/replica"
	"github.com/sylva-projects/osimages/internal/testenv"
)

// TestServeReplicasRollingUpdateMidFill: a StatefulSet's RollingUpdate
// while the registry is a third of the way through sending a gzip layer
// to the replica that pulls it, the two others following it. For each
// pod in turn, r2, r1 then r0: its endpoint goes, it gets SIGTERM and
// exits, and it starts again on its volume, first without an endpoint (a
// new pod has no address yet), then listed; the next pod is replaced once
// the new one is Ready, as the StatefulSet controller waits.
//
// Ready is /readyz, which is what the pod's readiness probe asks
// (charts/osimages): a replica is ready once it has read its inputs and
// its peers and holds every image a ready peer holds verified
// (server.ReplicaReady). An image still in flight is held verified by no
// one, so a replica filling it is Ready: the rollout goes on while the
// layer is sent, which is the case where a replaced replica could claim
// the layer alone or start it again from byte 0. The other image (a raw
// layer, not paced) is held verified by every replica by then, as a rule:
// a new pod is Ready only once it holds it too, from its volume.
//
// The registry sends the layer about once: a puller SIGTERMed mid-layer
// records a last checkpoint of what it wrote, its followers theirs when
// its stream ends, and the next in rendezvous order continues the pull
// from its own checkpoint, the others following it from theirs (the
// replaced puller too, once back). What may be sent again is what the
// SIGTERMed puller had received past its successor's checkpoint:
//   - a successor that ran all along streamed the layer as the puller
//     wrote it, and a pass cut short records the last mark it wrote
//     (pull: one every 512 KiB). The bound is that of
//     TestServeReplicasRestartEveryPodMidFill, for a SIGKILL that records
//     no last checkpoint: the puller's checkpoint step (2 MiB,
//     pull.Puller.CheckpointBytes), here for each puller SIGTERMed while
//     it pulled the layer (one to three: whoever takes over may be the
//     next pod replaced);
//   - a successor replaced earlier in the rollout continues from the
//     checkpoint it kept when it stopped, so it also lags by what the
//     registry sent since, at most what it sent during the rollout. That
//     happens once at most: a replaced pod is not replaced again, so the
//     pull it takes over is not handed over again.
//
// On top of that, the 5 % the other tests allow.
func TestServeReplicasRollingUpdateMidFill(t *testing.T) {
	const checkpointStep = 2 << 20
	counter := &blobCounter{}
	// The gzip layer (24 MiB) comes at about 1 MiB/s, so that its fill
	// outlasts the rollout (a few seconds), and well above --min-rate, so
	// that no follower gives up its puller as too slow. The raw image
	// comes at once. A successor that pulled the layer again from byte 0
	// would cost a third of it, 8 MiB, above what the bound allows.
	pacer := &layerPacer{chunk: 32 << 10, every: 30 * time.Millisecond}
	reg := testenv.Registry(t, devregistry.Options{Middleware: func(next http.Handler) http.Handler {
		return pacer.middleware(counter.middleware(next))
	}})
	args, sums, blobBytes := replicaImages(t, reg, 96<<20)
	gzSum, layer, layerDigest := gzipLayer(t, reg)
	pacer.digest.Store(&layerDigest)
	ids := []string{"r0", "r1", "r2"}
	order := replica.Rendezvous(gzSum.String(), ids)
	t.Logf("the gz layer is %d bytes; rendezvous order %v", layer, order)
	rs := newReplicaSet(t, append(args, "--replicas", "3")...)
	data := map[string]string{}
	start := time.Now()
	for _, id := range ids {
		data[id] = t.TempDir()
		rs.start(id, nil, "--data", data[id])
	}
	testenv.Eventually(t, "a third of the layer sent to its puller, the others following it", 120*time.Second, func() (bool, string) {
		if counter.sentOf(layerDigest) < layer/3 {
			return false, fmt.Sprintf("%d bytes of the layer sent", counter.sentOf(layerDigest))
		}
		for _, id := range order[1:] {
			st := rs.get(id).state()
			if st == nil || st.Images[gzSum].Source != fill.FromPeerPrefix+order[0] || st.Images[gzSum].Received == 0 {
				return false, fmt.Sprintf("%s: %v", id, st)
			}
		}
		return true, ""
	})
	t.Logf("a third of the layer sent %s after the start", time.Since(start).Round(time.Millisecond))

	replaced := map[string]*serverReplica{}
	rolloutStart := counter.sentOf(layerDigest)
	pullersKilled := 0
	midLayer := map[string]bool{}
	for _, id := range []string{"r2", "r1", "r0"} {
		old := rs.get(id)
		replaced[id] = old
		if st := old.state(); st != nil {
			img := st.Images[gzSum]
			midLayer[id] = !img.Verified() && img.Received > 0
			if midLayer[id] && img.Source == fill.FromRegistry {
				pullersKilled++
			}
		}
		// The pod is deleted: its endpoint goes, and it gets SIGTERM.
		old.removed.Store(true)
		old.d.kill(syscall.SIGTERM)
		if ws, ok := old.d.cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
			t.Errorf("%s did not exit within 15 s of SIGTERM, and was killed:\n%s", id, old.d.stderr.String())
		}
		testenv.Eventually(t, id+"'s endpoint gone", 30*time.Second, func() (bool, string) {
			_, err := rs.k.Client.DiscoveryV1().EndpointSlices(rs.ns).Get(context.Background(), "osimages-"+id, metav1.GetOptions{})
			return apierrors.IsNotFound(err), fmt.Sprint(err)
		})
		// The new pod, on the same volume, runs a second before it has an
		// address: long enough to read its peers and see them settle, and
		// claim what it would claim, while the others do not list it.
		r := rs.startListed(false, id, nil, "--data", data[id])
		testenv.Eventually(t, "the new "+id+" answers with the selected images", 60*time.Second, func() (bool, string) {
			st := r.state()
			return st != nil && len(st.Images) >= len(sums), fmt.Sprint(st)
		})
		time.Sleep(time.Second)
		r.unlisted.Store(false)
		testenv.Eventually(t, "the new "+id+" is Ready", 120*time.Second, func() (bool, string) {
			c := http.Client{Timeout: 2 * time.Second}
			resp, err := c.Get(r.d.url("/readyz"))
			if err != nil {
				return false, err.Error()
			}
			resp.Body.Close()
			return resp.StatusCode == http.StatusOK, resp.Status
		})
		t.Logf("%s replaced and Ready %s after the start, %d bytes of the layer sent", id, time.Since(start).Round(time.Millisecond), counter.sentOf(layerDigest))
	}
	rolled := counter.sentOf(layerDigest)
	if rolled >= layer {
		t.Logf("the layer was sent in full before the rollout ended: the last replicas filled it from a verified copy")
	}
	rs.waitHold(ids, sums...)
	sent := counter.sentOf(layerDigest)
	t.Logf("every replica holds every image %s after the start; the registry sent %d bytes of the layer's %d (%.3f×), %d when the rollout started, %d when it ended; %d blob bytes in all for blobs of %d (%.3f×); %d pullers SIGTERMed mid-layer",
		time.Since(start).Round(time.Millisecond), sent, layer, float64(sent)/float64(layer), rolloutStart, rolled, counter.sent.Load(), blobBytes, float64(counter.sent.Load())/float64(blobBytes), pullersKilled)
	if bound := 1.05*float64(layer) + float64(pullersKilled*checkpointStep) + float64(rolled-rolloutStart); float64(sent) > bound {
		t.Errorf("the registry sent %d bytes of the layer's %d (%.2f×), over %.0f: a replaced replica pulled it alone, or from byte 0", sent, layer, float64(sent)/float64(layer), bound)
	}
	if bound := 1.05*float64(blobBytes) + float64(pullersKilled*checkpointStep) + float64(rolled-rolloutStart); float64(counter.sent.Load()) > bound {
		t.Errorf("the registry sent %d blob bytes for blobs of %d, over %.0f", counter.sent.Load(), blobBytes, bound)
	}
	// One registry pull, the others following it.
	var pullers []string
	for _, id := range ids {
		if rs.get(id).state().Images[gzSum].Source == fill.FromRegistry {
			pullers = append(pullers, id)
		}
	}
	if len(pullers) != 1 {
		t.Errorf("%v filled the gz image from the registry, want one replica", pullers)
	}
	for _, id := range ids {
		src := rs.get(id).state().Images[gzSum].Source
		t.Logf("%s holds the gz image from %s", id, src)
		if len(pullers) == 1 && id != pullers[0] && src != fill.FromPeerPrefix+pullers[0] {
			t.Errorf("%s filled the gz image from %q, want peer %s", id, src, pullers[0])
		}
	}
	// Each replica replaced mid-layer continued it from what it kept.
	for _, id := range ids {
		if !midLayer[id] {
			continue
		}
		if src := rs.get(id).state().Images[gzSum].Source; !continued(rs.get(id).d.stderr.String(), gzSum, src) {
			t.Errorf("the new %s did not continue the layer from what it kept (source %s)", id, src)
		}
	}
	if t.Failed() {
		for _, id := range ids {
			t.Logf("%s before its replacement:\n%s", id, replaced[id].d.stderr.String())
			t.Logf("%s after:\n%s", id, rs.get(id).d.stderr.String())
		}
	}
}

// layerPacer sends the blob of one digest a chunk every interval, and
// the others at once.
type layerPacer struct {
	digest atomic.Pointer[string]
	chunk  int
	every  time.Duration
}

func (p *layerPacer) middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d := p.digest.Load()
		if d != nil && r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/blobs/"+*d) {
			next.ServeHTTP(&layerPacedResponse{ResponseWriter: w, p: p}, r)
			return
		}
		next.ServeHTTP(w, r)
	})
}

type layerPacedResponse struct {
	http.ResponseWriter
	p *layerPacer
}

func (w *layerPacedResponse) Write(b []byte) (int, error) {
	written := 0
	for len(b) > 0 {
		n, err := w.ResponseWriter.Write(b[:min(len(b), w.p.chunk)])
		written += n
		if err != nil {
			return written, err
		}
		b = b[n:]
		w.ResponseWriter.(http.Flusher).Flush()
		time.Sleep(w.p.every)
	}
	return written, nil
}
