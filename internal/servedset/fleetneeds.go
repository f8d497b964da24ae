package servedset

import (
	"cmp"
	"fmt"
	"net/url"
	"slices"
	"strings"

	"github.com/sylva-projects/osimages/internal/catalog"
	"github.com/sylva-projects/osimages/internal/oci"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/values"
)

// Defaults of the quotas of FleetPolicy: a workload namespace normally
// needs the images of one or two Sylva releases (a two-step upgrade), a
// few per release; 10 images of up to 10 GiB leaves room for that and no
// more.
const (
	DefaultFleetMaxImages       = 10
	DefaultFleetMaxBytes  int64 = 100 << 30
)

// FleetPolicy bounds what the fleet's needs may make the image server
// download (--serve-fleet-needs): only from under the url of a registry
// the management values declare (oci.Under, the rule that also says which
// cosign keys apply) or the HTTP(S) prefixes the operator allows, within
// per-namespace quotas, and within what --max-storage leaves beside the
// management selection. Signatures are checked at the pull, under the
// management values' keys, as for any image.
type FleetPolicy struct {
	// AllowPrefixes are the http:// or https:// URI prefixes a need may
	// be downloaded from.
	AllowPrefixes []string
	// MaxImages and MaxBytes bound, per namespace, the images served
	// because that namespace needs them and the management selection does
	// not (0: no bound).
	MaxImages int
	MaxBytes  int64
	// Storage is --max-storage (0: no bound but the disk): the management
	// selection is counted first, and the needs share what it leaves.
	Storage int64
	// MaxImageSize is what an image that declares no size counts for, in
	// the quotas and the storage: the most the server lets it take
	// (--max-image-size; 0 means the server's default).
	MaxImageSize int64
}

// FleetNeeds returns the served set: the management selection, and the
// images the fleet needs that the policy admits. Nothing a need does
// changes what the management cluster serves, or what another namespace is
// served:
//
//   - an image the management selects stays as it is selected; a namespace
//     that needs it only adds the filenames its URLs ask for;
//   - every filename that an admitted namespace's URLs or record give the
//     image is served (/images/<sha256>/<filename> is content-addressed);
//   - every record the policy admits is kept, in the order the download
//     tries them (Wanted.Records): a record that names a wrong tag or
//     registry path fails its attempt and the next is tried, so that no
//     record can block the image for the others;
//   - quotas and storage are charged per namespace, each namespace charged
//     what its own record declares (an image without size counts as
//     MaxImageSize); under Storage, the needs share what the management
//     selection and the images kept on disk leave, max-min fairly: the
//     namespace charged least so far is served next. Images stored already
//     are admitted before new ones, so that a new need never evicts an
//     image a cluster already boots from.
//
// The refusals are the document's own (a namespace over its share of it)
// and those of the policy, per needing namespace, each with its own
// reason. stored is what the server stores now, sha256 -> bytes. The same
// inputs always give the same result.
func FleetNeeds(mgmt values.Values, needs osimage.FleetNeeds, selected map[osimage.SHA256]Wanted, stored map[osimage.SHA256]int64, p FleetPolicy) (map[osimage.SHA256]Wanted, osimage.RefusedNeeds) {
	if p.MaxImageSize <= 0 {
		p.MaxImageSize = DefaultMaxImageSize
	}
	regs, _ := catalog.DeclaredRegistries(mgmt)
	out := make(map[osimage.SHA256]Wanted, len(selected)+len(needs.Images))
	for sha, w := range selected {
		w.Filenames = slices.Clone(w.Filenames)
		out[sha] = w
	}
	var refused osimage.RefusedNeeds
	for _, r := range needs.Refused {
		if r.Namespace != "" {
			refused = append(refused, r)
		}
	}
	refuse := func(sha osimage.SHA256, ns, reason, msg string) {
		refused = append(refused, osimage.RefusedNeed{SHA256: sha, Namespace: ns, Reason: reason, Message: msg})
	}

	var cands []*candidate
	for _, need := range needs.Images {
		if w, ok := out[need.SHA256]; ok {
			// Served for the management cluster: its bytes and record
			// stay; the needing namespaces' URLs are served too.
			for _, ns := range need.Namespaces {
				w.Filenames = addNames(w.Filenames, namesOf(need, ns)...)
			}
			out[need.SHA256] = w
			continue
		}
		c, reasons := admitRecords(need, regs, p.AllowPrefixes)
		if c == nil {
			for _, ns := range need.Namespaces {
				refuse(need.SHA256, ns, reasons[ns][0], reasons[ns][1])
			}
			continue
		}
		for _, rec := range c.records {
			c.cost = max(c.cost, rec.Desc.DiskCost(p.MaxImageSize))
		}
		if n, ok := stored[need.SHA256]; ok {
			c.stored, c.cost = true, n
		}
		cands = append(cands, c)
	}

	budget := int64(-1)
	if p.Storage > 0 {
		budget = p.Storage
		for sha, w := range selected {
			if n, ok := stored[sha]; ok {
				budget -= n
				continue
			}
			budget -= w.Desc.DiskCost(p.MaxImageSize)
		}
		for sha, n := range stored {
			// Kept on disk for a grace period or a reference: not to be
			// freed by a need.
			if _, sel := selected[sha]; !sel && !slices.ContainsFunc(cands, func(c *candidate) bool { return c.need.SHA256 == sha }) {
				budget -= n
			}
		}
	}
	a := admission{p: p, budget: budget, count: map[string]int{}, bytes: map[string]int64{}, charged: map[string]int64{}, refuse: refuse}
	// Stored first, then new; within each, max-min fair between
	// namespaces.
	a.run(cands, true)
	a.run(cands, false)

	for _, c := range cands {
		if len(c.admitted) == 0 {
			continue
		}
		out[c.need.SHA256] = c.wanted()
	}
	refused.Sort()
	return out, refused
}

// DefaultMaxImageSize is the image server's default --max-image-size
// (server.DefaultMaxImageSize is this one): what a fleet need without a
// size is charged.
const DefaultMaxImageSize = 64 << 30

// candidate is a need whose records the policy admits.
type candidate struct {
	need osimage.FleetNeed
	// records are the admitted ones; own is the index in records of each
	// namespace's own record.
	records []Record
	own     map[string]int
	// stored: the server holds it already; cost is what it takes on disk.
	stored bool
	cost   int64
	// admitted are the namespaces it is served for; storageRefused is set
	// once it did not fit.
	admitted       []string
	storageRefused string
}

// admitRecords keeps the records of need that the policy admits, or, when
// it admits none, returns each needing namespace's reason: its own
// record's refusal, else the first one's.
func admitRecords(need osimage.FleetNeed, regs []catalog.DeclaredRegistry, prefixes []string) (*candidate, map[string][2]string) {
	c := &candidate{need: need, own: map[string]int{}}
	var first [2]string
	ownReason := map[string][2]string{}
	for _, src := range need.Sources {
		rec := Record{Key: src.Key, Desc: src.Image.Descriptor(), Namespaces: src.Namespaces}
		reason, msg := admitSource(need.SHA256, src.Image, rec, regs, prefixes)
		if reason != "" {
			if first[0] == "" {
				first = [2]string{reason, msg}
			}
			for _, ns := range src.Namespaces {
				ownReason[ns] = [2]string{reason, msg}
			}
			continue
		}
		for _, ns := range src.Namespaces {
			c.own[ns] = len(c.records)
		}
		c.records = append(c.records, rec)
	}
	if len(c.records) > 0 {
		return c, nil
	}
	if first[0] == "" {
		first = [2]string{osimage.RefusedNoRecord, "no os-images-info of a needing namespace describes this image: nothing says where its bytes are"}
	}
	reasons := map[string][2]string{}
	for _, ns := range need.Namespaces {
		if r, ok := ownReason[ns]; ok {
			reasons[ns] = r
		} else {
			reasons[ns] = first
		}
	}
	return nil, reasons
}

// charge is what the image counts for in namespace ns's quota: its own
// record's bound, or the most any admitted record declares.
func (c *candidate) charge(ns string, maxImage int64) int64 {
	if i, ok := c.own[ns]; ok {
		return c.records[i].Desc.Bound(maxImage)
	}
	var most int64
	for _, rec := range c.records {
		most = max(most, rec.Desc.Bound(maxImage))
	}
	return most
}

// wanted is the served-set entry of an admitted need: its records in the
// order they are tried (those of the namespaces it is served for first,
// the most shared first), and every filename those namespaces use.
func (c *candidate) wanted() Wanted {
	admitted := func(rec Record) int {
		n := 0
		for _, ns := range rec.Namespaces {
			if slices.Contains(c.admitted, ns) {
				n++
			}
		}
		return n
	}
	records := slices.Clone(c.records)
	slices.SortStableFunc(records, func(a, b Record) int { return admitted(b) - admitted(a) })
	w := Wanted{SHA256: c.need.SHA256, ForNamespaces: slices.Sorted(slices.Values(c.admitted)),
		SelectedBy: []string{"fleet needs of " + strings.Join(slices.Sorted(slices.Values(c.admitted)), ", ")}}
	w.Records = records
	w.Use(records[0])
	for _, ns := range c.admitted {
		w.Filenames = addNames(w.Filenames, namesOf(c.need, ns)...)
	}
	if len(w.Filenames) == 0 {
		w.Filenames = []string{w.Desc.Filename}
	}
	return w
}

// namesOf returns the filenames namespace ns uses for need: those its URLs
// ask for, and its own record's.
func namesOf(need osimage.FleetNeed, ns string) []string {
	var names []string
	for _, name := range need.Filenames[ns] {
		if osimage.ValidateFilename(name) == nil {
			names = append(names, name)
		}
	}
	for _, src := range need.Sources {
		if slices.Contains(src.Namespaces, ns) {
			if name, err := src.Image.Filename(); err == nil {
				names = append(names, name)
			}
		}
	}
	return names
}

// addNames adds names to the sorted set names.
func addNames(names []string, more ...string) []string {
	for _, n := range more {
		if !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	return names
}

// admission decides, namespace by namespace, which candidates are served.
type admission struct {
	p FleetPolicy
	// budget is the storage left for needs, -1 without a bound.
	budget  int64
	count   map[string]int
	bytes   map[string]int64
	charged map[string]int64
	refuse  func(sha osimage.SHA256, ns, reason, msg string)
}

// run decides the candidates whose stored flag is stored: each turn, the
// namespace charged least so far (then by name) takes its next need, in
// sha256 order.
func (a *admission) run(cands []*candidate, stored bool) {
	queues := map[string][]*candidate{}
	for _, c := range cands {
		if c.stored != stored {
			continue
		}
		for _, ns := range c.need.Namespaces {
			queues[ns] = append(queues[ns], c)
		}
	}
	for ns := range queues {
		slices.SortFunc(queues[ns], func(x, y *candidate) int { return cmp.Compare(x.need.SHA256, y.need.SHA256) })
	}
	for len(queues) > 0 {
		ns := ""
		for n := range queues {
			if ns == "" || a.charged[n] < a.charged[ns] || a.charged[n] == a.charged[ns] && n < ns {
				ns = n
			}
		}
		c := queues[ns][0]
		if queues[ns] = queues[ns][1:]; len(queues[ns]) == 0 {
			delete(queues, ns)
		}
		a.decide(c, ns)
	}
}

// decide serves c for ns, or refuses it for ns.
func (a *admission) decide(c *candidate, ns string) {
	sha := c.need.SHA256
	size := c.charge(ns, a.p.MaxImageSize)
	note := ""
	if i, own := c.own[ns]; !own {
		note = "; this namespace has no admitted record of it, so it counts as the largest size an admitted record declares"
	} else if c.records[i].Desc.Size <= 0 {
		note = fmt.Sprintf("; its record declares no size, so it counts as --max-image-size %d: declare its size", a.p.MaxImageSize)
	}
	switch {
	case a.p.MaxImages > 0 && a.count[ns] >= a.p.MaxImages:
		a.refuse(sha, ns, osimage.RefusedImages, fmt.Sprintf("quota of %d images reached", a.p.MaxImages))
		return
	case a.p.MaxBytes > 0 && size > a.p.MaxBytes-a.bytes[ns]:
		// Compared as what is left: a declared size near 2^63 would wrap
		// a sum around and let every later image through.
		a.refuse(sha, ns, osimage.RefusedBytes, fmt.Sprintf("quota of %d bytes reached (%d used, this image is %d%s)", a.p.MaxBytes, a.bytes[ns], size, note))
		return
	case c.storageRefused != "":
		a.refuse(sha, ns, osimage.RefusedStorage, c.storageRefused)
		return
	}
	if len(c.admitted) == 0 && a.budget >= 0 {
		if c.cost > a.budget {
			c.storageRefused = fmt.Sprintf("not enough storage: the image takes %d bytes and --max-storage leaves %d for the fleet's needs once the management selection and the other namespaces' shares are counted", c.cost, a.budget)
			a.refuse(sha, ns, osimage.RefusedStorage, c.storageRefused)
			return
		}
		a.budget -= c.cost
		a.charged[ns] += c.cost
	}
	c.admitted = append(c.admitted, ns)
	a.count[ns]++
	a.bytes[ns] += size
	if a.budget < 0 {
		a.charged[ns] += size
	}
}

// admitSource says why the policy refuses src, "" when it admits it.
func admitSource(sha osimage.SHA256, img osimage.Image, src Record, regs []catalog.DeclaredRegistry, prefixes []string) (string, string) {
	if got, err := img.SHA256(); err != nil || got != sha {
		return osimage.RefusedInvalid, fmt.Sprintf("the record %s does not pin sha256 %s", src.Key, sha)
	}
	if _, err := img.Filename(); err != nil {
		return osimage.RefusedInvalid, fmt.Sprintf("the record %s cannot be served: %v", src.Key, err)
	}
	if err := src.Desc.Err; err != nil {
		return osimage.RefusedInvalid, fmt.Sprintf("the record %s: %v", src.Key, err)
	}
	uri := src.Desc.URI
	if strings.HasPrefix(uri, "oci://") {
		if _, err := oci.ParseReference(uri); err != nil {
			return osimage.RefusedInvalid, fmt.Sprintf("the record %s: uri %s is no OCI image reference: %v", src.Key, uri, err)
		}
		// Under a declared registry's url, not merely on its host: on a
		// shared registry host every user's repository is on the host, and
		// a registry's cosign key applies by the same rule, so that
		// nothing is admitted because of a registry without its key.
		if slices.ContainsFunc(regs, func(r catalog.DeclaredRegistry) bool { return oci.Under(uri, r.URL) }) {
			return "", ""
		}
		declared := "none"
		if len(regs) > 0 {
			names := make([]string, len(regs))
			for i, r := range regs {
				names[i] = r.String()
			}
			declared = strings.Join(names, ", ")
		}
		return osimage.RefusedRegistry, fmt.Sprintf("uri %s (record %s) is under no registry url the management values declare "+
			"(os_images_oci_registries: %s), and the image server pulls the fleet's needs only from under one, where its cosign key applies: "+
			"publish the image under one of them, or ask the operator to declare its repository in the management values' os_images_oci_registries", uri, src.Key, declared)
	}
	u, err := url.Parse(uri)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") {
		return osimage.RefusedURI, fmt.Sprintf("uri %q is neither oci:// nor http(s)://", uri)
	}
	// A prefix is a place the operator trusts: a URI that climbs out of
	// it or carries credentials is not under it, whatever its spelling.
	if u.User != nil || slices.Contains(strings.Split(u.Path, "/"), "..") || strings.Contains(uri, "%") {
		return osimage.RefusedURI, fmt.Sprintf("uri %s is refused: it carries credentials, a .. segment or an escape", uri)
	}
	for _, prefix := range prefixes {
		if strings.HasPrefix(uri, prefix) {
			return "", ""
		}
	}
	return osimage.RefusedURI, fmt.Sprintf("uri %s is under no prefix allowed by the image server (--fleet-needs-allow-prefix)", uri)
}
