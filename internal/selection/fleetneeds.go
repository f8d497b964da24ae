package selection

import (
	"fmt"
	"net/url"
	"slices"
	"strings"

	"github.com/sylva-projects/osimages/internal/catalog"
	"github.com/sylva-projects/osimages/internal/fleet"
	"github.com/sylva-projects/osimages/internal/oci"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/values"
)

// FleetPolicy bounds what the fleet's needs may make the image server
// download (--serve-fleet-needs): only from the registries the management
// values declare or the HTTP(S) prefixes the operator allows, and within
// per-namespace quotas. Signatures are checked at the pull, under the
// management values' keys, as for any image; --max-storage bounds the
// whole store.
type FleetPolicy struct {
	// AllowPrefixes are the http:// or https:// URI prefixes a need may
	// be downloaded from.
	AllowPrefixes []string
	// MaxImages and MaxBytes bound, per namespace, the images served
	// because that namespace needs them and the management selection does
	// not (0: no bound).
	MaxImages int
	MaxBytes  int64
}

// The reasons of a refusal, as metrics label them.
const (
	RefusedRegistry = "registry-not-allowed"
	RefusedURI      = "uri-not-allowed"
	RefusedImages   = "quota-images"
	RefusedBytes    = "quota-bytes"
	RefusedNoRecord = "no-record"
	RefusedInvalid  = "invalid"
)

// FleetNeeds returns the images the fleet needs that the policy admits
// and the management selection does not already serve, and the refusal
// of the others, per needing namespace. The record served is one of the
// needing namespaces' own (pinned by its sha256, and its manifest digest
// when it has one: the download verifies both), so a tenant's catalog can
// make the server fetch only the bytes it names, from where the
// management cluster allows. Needs are admitted in sha256 order, those
// already served (a set the caller gives: what the server serves now)
// first, so that a new need never evicts an image a cluster already runs
// from, and the same fleet always gives the same verdicts; an image is charged to
// the quota of each needing namespace that still has room, and served if
// one has; a namespace without room sees it refused only when no other
// namespace got it served.
func FleetNeeds(mgmt values.Values, needs fleet.FleetNeeds, selected map[string]Wanted, served func(sha256 string) bool, p FleetPolicy) (map[string]Wanted, osimage.RefusedNeeds) {
	hosts, _ := catalog.RegistryHosts(mgmt)
	out := map[string]Wanted{}
	var refused osimage.RefusedNeeds
	count := map[string]int{}
	bytes := map[string]int64{}
	refuse := func(sha string, namespaces []string, reason, msg string) {
		for _, ns := range namespaces {
			refused = append(refused, osimage.RefusedNeed{SHA256: sha, Namespace: ns, Reason: reason, Message: msg})
		}
	}
	sorted := slices.Clone(needs.Images)
	first := func(n fleet.FleetNeed) int {
		if served != nil && served(n.SHA256) {
			return 0
		}
		return 1
	}
	slices.SortFunc(sorted, func(a, b fleet.FleetNeed) int {
		if c := first(a) - first(b); c != 0 {
			return c
		}
		return strings.Compare(a.SHA256, b.SHA256)
	})
	for _, need := range sorted {
		if _, ok := selected[need.SHA256]; ok {
			continue
		}
		src, reason, msg := pickSource(need, hosts, p.AllowPrefixes)
		if reason != "" {
			refuse(need.SHA256, need.Namespaces, reason, msg)
			continue
		}
		size, _ := src.Image.Size(osimage.FieldSize)
		var admitted []string
		var quotaReason, quotaMsg string
		for _, ns := range need.Namespaces {
			switch {
			case p.MaxImages > 0 && count[ns] >= p.MaxImages:
				quotaReason, quotaMsg = RefusedImages, fmt.Sprintf("quota of %d images reached", p.MaxImages)
			case p.MaxBytes > 0 && bytes[ns]+size > p.MaxBytes:
				quotaReason, quotaMsg = RefusedBytes, fmt.Sprintf("quota of %d bytes reached (%d used, this image is %d)", p.MaxBytes, bytes[ns], size)
			default:
				admitted = append(admitted, ns)
			}
		}
		if len(admitted) == 0 {
			refuse(need.SHA256, need.Namespaces, quotaReason, quotaMsg)
			continue
		}
		for _, ns := range admitted {
			count[ns]++
			bytes[ns] += size
		}
		name, _ := src.Image.Filename()
		out[need.SHA256] = Wanted{
			SHA256: need.SHA256, Key: src.Key, Image: src.Image, Filenames: []string{name},
			SelectedBy: []string{"fleet needs of " + strings.Join(admitted, ", ")},
		}
	}
	refused.Sort()
	return out, refused
}

// pickSource returns the first record of need (in the document's order)
// that the policy admits, or the reason the first one is refused.
func pickSource(need fleet.FleetNeed, hosts, prefixes []string) (fleet.NeedSource, string, string) {
	if len(need.Sources) == 0 {
		return fleet.NeedSource{}, RefusedNoRecord, "no os-images-info of a needing namespace describes this image: nothing says where its bytes are"
	}
	var reason, msg string
	for _, src := range need.Sources {
		r, m := admitSource(need.SHA256, src, hosts, prefixes)
		if r == "" {
			return src, "", ""
		}
		if reason == "" {
			reason, msg = r, m
		}
	}
	return fleet.NeedSource{}, reason, msg
}

// admitSource says why the policy refuses src, "" when it admits it.
func admitSource(sha string, src fleet.NeedSource, hosts, prefixes []string) (string, string) {
	img := src.Image
	if got, err := img.SHA256(); err != nil || string(got) != sha {
		return RefusedInvalid, fmt.Sprintf("the record %s does not pin sha256 %s", src.Key, sha)
	}
	if _, err := img.Filename(); err != nil {
		return RefusedInvalid, fmt.Sprintf("the record %s cannot be served: %v", src.Key, err)
	}
	if err := img.ValidateSizes(); err != nil {
		return RefusedInvalid, fmt.Sprintf("the record %s: %v", src.Key, err)
	}
	uri := img.Get(osimage.FieldURI)
	if repo, ok := oci.CanonicalRepository(uri); ok {
		host, _, _ := strings.Cut(repo, "/")
		if !slices.Contains(hosts, host) {
			return RefusedRegistry, fmt.Sprintf("registry %s is not allowed by the management values", host)
		}
		return "", ""
	}
	u, err := url.Parse(uri)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") {
		return RefusedURI, fmt.Sprintf("uri %q is neither oci:// nor http(s)://", uri)
	}
	// A prefix is a place the operator trusts: a URI that climbs out of
	// it or carries credentials is not under it, whatever its spelling.
	if u.User != nil || slices.Contains(strings.Split(u.Path, "/"), "..") || strings.Contains(uri, "%") {
		return RefusedURI, fmt.Sprintf("uri %s is refused: it carries credentials, a .. segment or an escape", uri)
	}
	for _, prefix := range prefixes {
		if strings.HasPrefix(uri, prefix) {
			return "", ""
		}
	}
	return RefusedURI, fmt.Sprintf("uri %s is under no prefix allowed by the image server (--fleet-needs-allow-prefix)", uri)
}
