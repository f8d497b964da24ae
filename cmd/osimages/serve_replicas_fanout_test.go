package main

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sylva-projects/osimages/internal/devregistry"
	"github.com/sylva-projects/osimages/internal/fill"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/replica"
	"github.com/sylva-projects/osimages/internal/testenv"
)

// fanOutSet starts five replicas expecting each other, each behind a
// proxy that counts what its peer port sends; corrupt names the replica
// whose proxy flips a byte of every layer it sends. It returns the
// replicas' IDs, the traffic of each, and the images.
func fanOutSet(t *testing.T, corrupt func(order []string) string) (rs *replicaSet, ids []string, traffic map[string]*peerTraffic, counter *blobCounter, sums []osimage.SHA256, blobBytes int64, gz, raw osimage.SHA256, gzLayer, rawSize int64) {
	counter = &blobCounter{}
	counter.trickle.Store(true)
	reg := testenv.Registry(t, devregistry.Options{Middleware: counter.middleware})
	args, sums, blobBytes := replicaImages(t, reg, 16<<20)
	gz = gzipImageSum(t, reg)
	for _, p := range publishedFor(t, reg) {
		if s := imageSHA(t, p); s == gz {
			gzLayer, _ = strconv.ParseInt(p.Fields.Get("archive-size"), 10, 64)
		} else {
			raw = s
			rawSize, _ = strconv.ParseInt(p.Fields.Get("size"), 10, 64)
		}
	}
	ids = []string{"r0", "r1", "r2", "r3", "r4"}
	bad := ""
	if corrupt != nil {
		bad = corrupt(replica.Rendezvous(gz.String(), ids))
	}
	rs = newReplicaSet(t, append(args, "--replicas", "5")...)
	traffic = map[string]*peerTraffic{}
	start := time.Now()
	for _, id := range ids {
		traffic[id] = &peerTraffic{}
		rs.start(id, peerProxy(t, traffic[id], id == bad))
	}
	rs.waitHold(ids, sums...)
	t.Logf("the 5 replicas hold every image %s after the start", time.Since(start).Round(time.Millisecond))
	return rs, ids, traffic, counter, sums, blobBytes, gz, raw, gzLayer, rawSize
}

// TestServeReplicasFanOutIsATree: with five replicas, the one that pulls
// an image from the registry feeds two followers (replica.FanOut), not
// four: the others follow those two, which serve the layer (or the image)
// they receive as they receive it, and every replica verifies all of it
// itself. Before, every follower streamed from the puller, whose NIC
// carried four copies.
func TestServeReplicasFanOutIsATree(t *testing.T) {
	// Five replicas show a tree only under a fan-out of 2: the puller
	// feeds two, which feed one or two each.
	const fanOut = 2
	rs, ids, traffic, counter, _, blobBytes, gz, raw, gzLayer, rawSize := fanOutSet(t, nil)
	if sent := counter.sent.Load(); sent < blobBytes || float64(sent) > 1.05*float64(blobBytes) {
		t.Errorf("the registry sent %d blob bytes for blobs of %d in all (%.2f×): want each once", sent, blobBytes, float64(sent)/float64(blobBytes))
	}
	for _, c := range []struct {
		sum  osimage.SHA256
		size int64
		sent func(*peerTraffic) int64
	}{{gz, gzLayer, func(p *peerTraffic) int64 { return p.blob.Load() }}, {raw, rawSize, func(p *peerTraffic) int64 { return p.image.Load() }}} {
		order := replica.Rendezvous(c.sum.String(), ids)
		var lines []string
		for _, id := range order {
			lines = append(lines, fmt.Sprintf("%s from %q sent %d", id, rs.get(id).state().Images[c.sum].Source, c.sent(traffic[id])))
		}
		t.Logf("image %s (%d bytes on the wire) in rendezvous order: %s", c.sum[:12], c.size, strings.Join(lines, "; "))
		if src := rs.get(order[0]).state().Images[c.sum].Source; src != fill.FromRegistry {
			t.Errorf("%s, first in rendezvous order, filled %s from %q, want the registry", order[0], c.sum[:12], src)
		}
		// At most fanOut copies from the puller (5 % for resumes).
		if got := c.sent(traffic[order[0]]); float64(got) > (fanOut+0.1)*float64(c.size) {
			t.Errorf("the puller %s sent %d bytes of %s to its followers, more than %d copies of %d", order[0], got, c.sum[:12], fanOut, c.size)
		}
		// Every copy went out once: four followers in all.
		var all int64
		for _, id := range ids {
			all += c.sent(traffic[id])
		}
		if all < 4*c.size {
			t.Errorf("the peers sent %d bytes of %s, less than four copies of %d", all, c.sum[:12], c.size)
		}
		for i, id := range order[1:] {
			want := fill.FromPeerPrefix + order[i/fanOut]
			if src := rs.get(id).state().Images[c.sum].Source; src != want {
				t.Errorf("%s filled %s from %q, want %q (the tree)", id, c.sum[:12], src, want)
			}
		}
	}
}

// TestServeReplicasRefuseACorruptingRelay: a follower that relays the
// layer to its own followers corrupts it (its proxy flips a byte): they
// refuse it at the end of their verification, report it and fill from
// higher up the tree; every replica ends with the verified image.
func TestServeReplicasRefuseACorruptingRelay(t *testing.T) {
	var relay string
	rs, ids, traffic, _, _, _, gz, _, _, _ := fanOutSet(t, func(order []string) string {
		relay = order[1]
		return relay
	})
	if traffic[relay].flipped.Load() == 0 {
		t.Fatalf("the relay %s sent no layer through its corrupting proxy: the test proves nothing", relay)
	}
	order := replica.Rendezvous(gz.String(), ids)
	for _, id := range order[3:] {
		r := rs.get(id)
		logs := r.d.stderr.String()
		if !strings.Contains(logs, `"msg":"peer failed to fill an image; filling it from elsewhere","peer":"`+relay+`"`) || !strings.Contains(logs, `"reason":"bad-bytes"`) {
			t.Errorf("%s did not report the corrupting relay %s", id, relay)
		}
		if src := r.state().Images[gz].Source; src == fill.FromPeerPrefix+relay {
			t.Errorf("%s kept the gz image from the corrupting relay", id)
		}
		if got, code := sha256Of(t, r.d.url("/images/"+gz.String()+"/"+imageFilename(t, r, gz))); code != 200 || got != gz.String() {
			t.Errorf("%s serves the gz image: %d, sha256 %s", id, code, got)
		}
	}
}
