package replica

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/sylva-projects/osimages/internal/fill"
	"github.com/sylva-projects/osimages/internal/imagelife"
	"github.com/sylva-projects/osimages/internal/osimage"
)

// TestAFirstListingOfNobodyIsNoSettledSet: replicas started together may
// each list nobody at first (the others have no address yet). That first
// listing starts the settle like any change, and a replica alone, the
// count of replicas unknown, waits the claim rule's Wait before it claims:
// before, it claimed at once, believing it was alone, and every replica
// started together pulled the image from the registry.
func TestAFirstListingOfNobodyIsNoSettledSet(t *testing.T) {
	rs := &replicas{self: "self"}
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	v := NewView(rs, nil, clk, ClaimRule{Wait: 10 * time.Second})
	v.readAll(context.Background())
	if v.Claimable() {
		t.Fatal("claimable at once after a first listing of nobody")
	}
	clk.Step(listedSettle)
	if v.Claimable() {
		t.Fatal("claimable alone, the count unknown, before the claim wait")
	}
	// A peer shows: the set settles, and two replicas are a set.
	a := startStatePeer(t, "a")
	rs.mu.Lock()
	rs.down = []Peer{a.Peer}
	rs.mu.Unlock()
	v.readAll(context.Background())
	if v.Claimable() {
		t.Fatal("claimable right after a replica was listed")
	}
	clk.Step(listedSettle)
	if !v.Claimable() {
		t.Fatal("not claimable once two replicas were listed and stayed the same")
	}
}

// TestClaimsWaitForTheExpectedReplicas: with the count of replicas known,
// a replica claims once it lists that many, itself included, and the set
// stayed the same; or once the claim wait passed since its first read,
// whatever it lists (a replica that cannot be scheduled never shows).
func TestClaimsWaitForTheExpectedReplicas(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	rs := &replicas{self: "self"}
	v := NewView(rs, nil, clk, ClaimRule{Replicas: 3, Wait: 10 * time.Second})
	ctx := context.Background()
	v.readAll(ctx)
	for _, id := range []string{"a", "b"} {
		clk.Step(listedSettle)
		if v.Claimable() {
			t.Fatalf("claimable with %d of 3 replicas listed", len(rs.Listed())+1)
		}
		p := startStatePeer(t, id)
		rs.mu.Lock()
		rs.down = append(rs.down, p.Peer)
		rs.mu.Unlock()
		v.readAll(ctx)
	}
	if v.Claimable() {
		t.Fatal("claimable right after the third replica was listed")
	}
	clk.Step(listedSettle)
	if !v.Claimable() {
		t.Fatal("not claimable with the 3 replicas listed, settled")
	}

	// Alone for good: the claim wait, counted from the first read.
	clk = clocktesting.NewFakeClock(time.Unix(1000, 0))
	v = NewView(&replicas{self: "self"}, nil, clk, ClaimRule{Replicas: 3, Wait: 10 * time.Second})
	v.readAll(ctx)
	clk.Step(10*time.Second - time.Millisecond)
	v.readAll(ctx)
	if v.Claimable() {
		t.Fatal("claimable alone before the claim wait")
	}
	clk.Step(time.Millisecond)
	if !v.Claimable() {
		t.Fatal("not claimable alone once the claim wait passed")
	}

	// A set of one expected: after the settle.
	clk = clocktesting.NewFakeClock(time.Unix(1000, 0))
	v = NewView(&replicas{self: "self"}, nil, clk, ClaimRule{Replicas: 1})
	v.readAll(ctx)
	clk.Step(listedSettle)
	if !v.Claimable() {
		t.Fatal("a set of one expected: not claimable alone once settled")
	}
}

func TestJudgeClaim(t *testing.T) {
	claiming := Image{Phase: imagelife.PhaseDownloading, Source: fill.FromRegistry, Claiming: true}
	pulling := Image{Phase: imagelife.PhaseDownloading, Source: fill.FromRegistry}
	following := Image{Phase: imagelife.PhaseDownloading, Source: fill.FromPeerPrefix + "x"}
	order := []string{"a", "self", "c", "d"}
	for _, tc := range []struct {
		name   string
		images map[string]Image
		want   Verdict
		peer   string
	}{
		{"nobody else", map[string]Image{}, Proceed, ""},
		{"peers that follow or wait", map[string]Image{"a": following, "c": {Phase: imagelife.PhaseQueued}}, Proceed, ""},
		{"a claimant first in order", map[string]Image{"a": claiming}, GiveWay, "a"},
		{"a claimant after", map[string]Image{"c": claiming}, Hold, "c"},
		{"a puller after", map[string]Image{"c": claiming, "d": pulling}, GiveWay, "d"},
		{"a verified copy after", map[string]Image{"d": {Phase: imagelife.PhaseReady}}, GiveWay, "d"},
		{"a failed claim left its source", map[string]Image{"a": {Phase: imagelife.PhaseFailed, Source: fill.FromRegistry}}, Proceed, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, peer := judgeClaim("self", order, tc.images)
			if got != tc.want || peer != tc.peer {
				t.Errorf("got %v %q, want %v %q", got, peer, tc.want, tc.peer)
			}
		})
	}
}

// claimer is a replica as its peers see it while it claims the registry
// pull of one image: a state endpoint that shows each step of the claim
// at once, as the server's does.
type claimer struct {
	Peer
	sum osimage.SHA256
	mu  sync.Mutex
	img Image
}

func startClaimer(t *testing.T, id string, sum osimage.SHA256) *claimer {
	c := &claimer{sum: sum, img: Image{Phase: imagelife.PhaseDownloading}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		c.mu.Lock()
		defer c.mu.Unlock()
		_ = json.NewEncoder(w).Encode(State{Replica: c.ID, Images: map[osimage.SHA256]Image{c.sum: c.img}})
	}))
	t.Cleanup(srv.Close)
	c.Peer = Peer{ID: id, URL: srv.URL}
	return c
}

func (c *claimer) step(_ osimage.SHA256, step ClaimStep) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch step {
	case ClaimAnnounced:
		c.img.Source, c.img.Claiming = fill.FromRegistry, true
	case ClaimConfirmed:
		c.img.Source, c.img.Claiming = fill.FromRegistry, false
	case ClaimWithdrawn:
		c.img.Source, c.img.Claiming = "", false
	}
}

// TestClaimsMadeTogetherLetOnePull: replicas that list each other and
// each chose to pull the same image from the registry at about the same
// moment confirm their claims against each other's states: exactly one
// pulls, whatever the interleaving. (Replicas that do not list each other
// cannot see each other's claims: the claim rule keeps them from claiming
// until they do, or the claim wait passed.)
func TestClaimsMadeTogetherLetOnePull(t *testing.T) {
	img := newImage(t, 16, 11)
	never := func(string) bool { return false }
	for _, tc := range []struct {
		name string
		// lists says whom each replica lists.
		lists map[string][]string
	}{
		{"each lists the others", map[string][]string{"a": {"b", "c"}, "b": {"a", "c"}, "c": {"a", "b"}}},
		{"two", map[string][]string{"a": {"b"}, "b": {"a"}}},
		{"five", map[string][]string{"a": {"b", "c", "d", "e"}, "b": {"a", "c", "d", "e"}, "c": {"a", "b", "d", "e"}, "d": {"a", "b", "c", "e"}, "e": {"a", "b", "c", "d"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for round := range 20 {
				claimers := map[string]*claimer{}
				for id := range tc.lists {
					claimers[id] = startClaimer(t, id, img.w.SHA256)
				}
				var mu sync.Mutex
				var pulled []string
				var wg sync.WaitGroup
				for id, lists := range tc.lists {
					rs := &replicas{self: id}
					for _, other := range lists {
						rs.down = append(rs.down, claimers[other].Peer)
					}
					f := &Filler{View: NewView(rs, nil, nil, ClaimRule{}), Wait: 5 * time.Second, Claim: claimers[id].step}
					// Staggered by up to 5 ms: reads land before, between
					// and after the others' announcements.
					delay := time.Duration(rand.IntN(5000)) * time.Microsecond
					wg.Go(func() {
						time.Sleep(delay)
						if f.claim(context.Background(), img.w, never) {
							mu.Lock()
							pulled = append(pulled, id)
							mu.Unlock()
						}
					})
				}
				wg.Wait()
				if len(pulled) != 1 {
					t.Fatalf("round %d: %v pull the image from the registry, want exactly one", round, pulled)
				}
			}
		})
	}
}
