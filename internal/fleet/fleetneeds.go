package fleet

import (
	"cmp"
	"fmt"
	"maps"
	"slices"

	"sigs.k8s.io/yaml"

	"github.com/sylva-projects/osimages/internal/clip"
	"github.com/sylva-projects/osimages/internal/osimage"
)

// NamespaceNeeds is what one namespace contributes: the check's report of
// it and its own catalog (A), nil when it has none.
type NamespaceNeeds struct {
	Report  osimage.CheckReport
	Catalog osimage.Catalog
}

// Aggregate is AggregateWithin osimage.NeedsDocumentBudget.
func Aggregate(namespaces []NamespaceNeeds) osimage.FleetNeeds {
	return AggregateWithin(namespaces, osimage.NeedsDocumentBudget)
}

// contribution is what one namespace puts into the document.
type contribution struct {
	ns      string
	needs   []nsNeed
	refused osimage.RefusedNeeds
	// bytes is what its needs take in the document, counting a record it
	// shares with others in full: a namespace is never charged less than
	// it would take alone.
	bytes int
}

// nsNeed is one image a namespace needs.
type nsNeed struct {
	sha       osimage.SHA256
	filenames []string
	// key and record are its own catalog's record, cut down; doc is the
	// record's YAML; ok is false when it has none.
	key, doc string
	record   osimage.Image
	ok       bool
}

// AggregateWithin gathers the needs of every namespace into the fleet's,
// sorted by sha256, so that the same fleet always gives the same document.
// A record is taken only when its sha256 is the one needed (a catalog
// cannot make a need point at other bytes), and is cut down to osimage.NeedFields;
// one still over osimage.MaxNeedRecordBytes is left out, and refused. A need whose
// sha256 or a filename the served-image rule refuses is left out (the
// check reports it in the namespace's status).
//
// The namespaces share budget bytes of the document max-min fairly: each
// gets what it needs up to an equal share of what those that need less
// leave; a namespace over that share is left out as a whole, with one
// refusal (osimage.RefusedDocumentShare), and the others are published as
// if it were not there. So one tenant can never freeze the fleet's needs by
// making the document too large.
func AggregateWithin(namespaces []NamespaceNeeds, budget int) osimage.FleetNeeds {
	var contribs []contribution
	for _, n := range namespaces {
		contribs = append(contribs, contribute(n))
	}
	admitted, refused := share(contribs, budget)
	return assemble(admitted, refused)
}

// contribute reads what one namespace needs, and what it costs.
func contribute(n NamespaceNeeds) contribution {
	c := contribution{ns: n.Report.Namespace}
	seen := map[osimage.SHA256]bool{}
	for _, img := range n.Report.Images {
		if seen[img.SHA256] {
			continue
		}
		seen[img.SHA256] = true
		need := nsNeed{sha: img.SHA256}
		for _, name := range img.Filenames {
			if osimage.ValidateFilename(name) == nil && !slices.Contains(need.filenames, name) {
				need.filenames = append(need.filenames, name)
			}
		}
		slices.Sort(need.filenames)
		c.bytes += len(need.sha) + 2*len(c.ns) + 64
		for _, name := range need.filenames {
			c.bytes += len(name) + 8
		}
		if key, rec, ok := recordOf(n.Catalog, img); ok {
			doc, _ := yaml.Marshal(rec)
			if len(doc) > osimage.MaxNeedRecordBytes {
				c.refused = append(c.refused, osimage.RefusedNeed{SHA256: img.SHA256, Namespace: c.ns, Reason: osimage.RefusedInvalid,
					Message: fmt.Sprintf("its record os_images.%s takes %d bytes once cut down to the fields the image server reads, over the bound of %d: shorten its uri", clip.String(key, 128), len(doc), osimage.MaxNeedRecordBytes)})
			} else {
				need.key, need.doc, need.record, need.ok = key, string(doc), rec, true
				c.bytes += len(key) + len(doc) + len(c.ns) + 32
			}
		}
		c.needs = append(c.needs, need)
	}
	for _, r := range c.refused {
		c.bytes += len(r.Message) + len(r.SHA256) + len(c.ns) + 64
	}
	return c
}

// share admits namespaces max-min fairly within budget bytes: in order of
// what they take, each while it takes no more than an equal share of what
// is left; from the first that takes more, every one left takes more than
// that same share, and is refused.
func share(contribs []contribution, budget int) ([]contribution, osimage.RefusedNeeds) {
	slices.SortFunc(contribs, func(a, b contribution) int { return cmp.Or(cmp.Compare(a.bytes, b.bytes), cmp.Compare(a.ns, b.ns)) })
	var admitted []contribution
	var refused osimage.RefusedNeeds
	left := budget
	for i, c := range contribs {
		fair := left / (len(contribs) - i)
		if c.bytes > fair {
			for _, over := range contribs[i:] {
				refused = append(refused, osimage.RefusedNeed{Namespace: over.ns, Reason: osimage.RefusedDocumentShare,
					Message: fmt.Sprintf("the needs of this namespace take %d bytes of the fleet's needs document, over its fair share of %d bytes (%d bytes shared by %d namespaces): none of them is published, so the image server serves this namespace only what the management cluster selects; need fewer images, or use shorter records and filenames",
						over.bytes, fair, budget, len(contribs))})
			}
			break
		}
		left -= c.bytes
		admitted = append(admitted, c)
	}
	for _, c := range admitted {
		refused = append(refused, c.refused...)
	}
	return admitted, refused
}

// assemble builds the document of the admitted namespaces.
func assemble(admitted []contribution, refused osimage.RefusedNeeds) osimage.FleetNeeds {
	type source struct {
		key, doc string
		image    osimage.Image
		ns       []string
	}
	type gathered struct {
		ns        []string
		sources   []*source
		filenames map[string][]string
	}
	bySHA := map[osimage.SHA256]*gathered{}
	for _, c := range admitted {
		for _, n := range c.needs {
			need := bySHA[n.sha]
			if need == nil {
				need = &gathered{}
				bySHA[n.sha] = need
			}
			need.ns = append(need.ns, c.ns)
			if len(n.filenames) > 0 {
				if need.filenames == nil {
					need.filenames = map[string][]string{}
				}
				need.filenames[c.ns] = n.filenames
			}
			if !n.ok {
				continue
			}
			i := slices.IndexFunc(need.sources, func(s *source) bool { return s.key == n.key && s.doc == n.doc })
			if i < 0 {
				need.sources = append(need.sources, &source{key: n.key, doc: n.doc, image: n.record})
				i = len(need.sources) - 1
			}
			need.sources[i].ns = append(need.sources[i].ns, c.ns)
		}
	}
	out := osimage.FleetNeeds{Images: []osimage.FleetNeed{}}
	for _, sha := range slices.Sorted(maps.Keys(bySHA)) {
		need := bySHA[sha]
		fn := osimage.FleetNeed{SHA256: sha, Namespaces: slices.Sorted(slices.Values(need.ns)), Filenames: need.filenames}
		slices.SortFunc(need.sources, func(a, b *source) int { return cmp.Or(cmp.Compare(a.key, b.key), cmp.Compare(a.doc, b.doc)) })
		for _, s := range need.sources {
			fn.Sources = append(fn.Sources, osimage.NeedSource{Key: s.key, Image: s.image, Namespaces: slices.Sorted(slices.Values(s.ns))})
		}
		out.Images = append(out.Images, fn)
	}
	refused.Sort()
	out.Refused = refused
	return out
}

// recordOf finds the catalog record of a needed image, cut down to
// osimage.NeedFields: under the key the check found, else under any key with
// that sha256.
func recordOf(cat osimage.Catalog, img osimage.ImageStatus) (string, osimage.Image, bool) {
	key := cat.KeyOf(img.SHA256, img.ImageKey)
	if key == "" {
		return "", nil, false
	}
	rec := osimage.Image{}
	for _, f := range osimage.NeedFields {
		if v, ok := cat[key][f].(string); ok {
			rec[f] = v
		}
	}
	return key, rec, true
}
