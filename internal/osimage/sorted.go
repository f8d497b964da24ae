package osimage

import (
	"maps"
	"slices"
	"strings"

	"sigs.k8s.io/yaml"
)

// marshalSorted renders the document {top: m}, m's keys in byte order.
//
// yaml's own key order compares runs of digits as numbers and sorts
// letters after digits only in some places, which is not an order on
// strings that mix both, such as sha256s ("a10b" < "a1b" < "a9c" <
// "a10b"): the order it writes then follows Go's random map iteration, and
// equal sets come out as different bytes from one call to the next. A
// document written again unchanged must be the same bytes (a propagated
// copy compares them; every byte change of the served set is a write of
// every copy), so each entry is marshalled alone and the entries are put
// in order here.
func marshalSorted[K ~string, V any](top string, m map[K]V) ([]byte, error) {
	if len(m) == 0 {
		return yaml.Marshal(map[string]map[K]V{top: {}})
	}
	var b strings.Builder
	b.WriteString(top + ":\n")
	for _, k := range slices.Sorted(maps.Keys(m)) {
		entry, err := yaml.Marshal(map[K]V{k: m[k]})
		if err != nil {
			return nil, err
		}
		// One more level of indentation keeps the entry's YAML, block
		// scalars included, as it was; empty lines stay empty.
		for _, line := range strings.SplitAfter(string(entry), "\n") {
			if strings.TrimRight(line, "\n") != "" {
				b.WriteString("  ")
			}
			b.WriteString(line)
		}
	}
	return []byte(b.String()), nil
}
