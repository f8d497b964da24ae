package replica

import (
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"slices"
)

// Rendezvous orders replicas for key by highest random weight: the weight
// of a replica is a hash of the key and its ID, so that every replica
// computes the same order from the same set, and removing a replica only
// moves the keys it was first for (the others keep their first). Ties
// (practically impossible) are broken by ID. The result is a new slice.
func Rendezvous(key string, ids []string) []string {
	type scored struct {
		id    string
		score uint64
	}
	all := make([]scored, 0, len(ids))
	for _, id := range ids {
		h := sha256.New()
		h.Write([]byte(key))
		h.Write([]byte{0})
		h.Write([]byte(id))
		all = append(all, scored{id, binary.BigEndian.Uint64(h.Sum(nil))})
	}
	// Highest score first; the same score, by ID.
	slices.SortFunc(all, func(a, b scored) int { return cmp.Or(cmp.Compare(b.score, a.score), cmp.Compare(a.id, b.id)) })
	out := make([]string, 0, len(all))
	for i, s := range all {
		if i > 0 && s.id == all[i-1].id {
			continue
		}
		out = append(out, s.id)
	}
	return out
}
