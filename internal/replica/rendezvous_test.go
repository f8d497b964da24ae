package replica

import (
	"fmt"
	"slices"
	"testing"
)

func TestRendezvousIsDeterministicAndIgnoresOrder(t *testing.T) {
	a := Rendezvous("sha", []string{"r0", "r1", "r2"})
	b := Rendezvous("sha", []string{"r2", "r0", "r1", "r0"})
	if !slices.Equal(a, b) || len(a) != 3 {
		t.Fatalf("orders differ: %v vs %v", a, b)
	}
}

func TestRendezvousMovesOnlyTheKeysOfARemovedReplica(t *testing.T) {
	ids := []string{"r0", "r1", "r2", "r3"}
	first := map[string]int{}
	for i := range 2000 {
		key := fmt.Sprintf("image-%d", i)
		all := Rendezvous(key, ids)
		first[all[0]]++
		without := Rendezvous(key, []string{"r0", "r1", "r3"})
		if all[0] != "r2" && without[0] != all[0] {
			t.Fatalf("%s: first moved from %s to %s although r2 was not first", key, all[0], without[0])
		}
		if all[0] == "r2" && without[0] != all[1] {
			t.Fatalf("%s: without r2 the first is %s, want the second of the full order %s", key, without[0], all[1])
		}
	}
	// Spread: each of 4 replicas is first for about a quarter of the keys.
	for _, id := range ids {
		if first[id] < 400 || first[id] > 600 {
			t.Errorf("replica %s is first for %d keys of 2000, want about 500: %v", id, first[id], first)
		}
	}
}

func TestRendezvousEmpty(t *testing.T) {
	if got := Rendezvous("k", nil); len(got) != 0 {
		t.Fatalf("got %v", got)
	}
}
