package propagate

import (
	"errors"
	"fmt"
	"maps"

	corev1 "k8s.io/api/core/v1"

	"github.com/sylva-projects/osimages/internal/clip"
	"github.com/sylva-projects/osimages/internal/osimage"
)

// A rule with a Catalog copies a served set (contract §6) into each
// namespace cut down to the entries that namespace can use: those whose
// sha256 its own catalog (Rule.Catalog, os-images-info) names, and those
// the fleet check found its clusters need (osimages-status), such as the
// image of a template made from an earlier catalog. Render picks from the
// namespace's catalog and only checks the pick against the copy, so an
// entry no catalog of the namespace names can never pass or fail one of
// its renders: dropping it changes no render, and the copies no longer
// grow with the served set times the namespaces.
//
// What a namespace cannot be shown to use is left out, never kept "to be
// safe": a missing or unreadable catalog gives a copy with no entry, so
// that a render fails loudly ("not served") rather than passes a check
// against data nobody vouched for. See docs/controllers.md.

// AnnotationPicks, on a filtered copy, says what it was cut down to and
// from what: the catalog's sha256s, the needs of osimages-status, or why
// there are none.
const AnnotationPicks = "propagate.osimages.sylva-project.org/picks"

// notesMax bounds the part of an annotation that quotes a parse error of a
// tenant's ConfigMap.
const notesMax = 512

// ServedSource is a rule's source read as the image server's output: the
// served set and the keys beside it, parsed once per version of the
// source.
type ServedSource struct {
	out osimage.ServedOutput
	// hasFilenames, hasOCI, hasRefused: which optional keys the source
	// holds; a copy holds the same ones.
	hasFilenames, hasOCI, hasRefused bool
	// other are the data keys osimages does not know, copied as they are.
	other  map[string]string
	binary map[string][]byte
	// err says why the source is not a served set.
	err error
}

// ReadServedSource parses src, the source of a rule with a Catalog.
func ReadServedSource(src *corev1.ConfigMap) ServedSource {
	var s ServedSource
	doc, ok := src.Data[osimage.ValuesKey]
	if !ok {
		s.err = fmt.Errorf("it has no data key %s", osimage.ValuesKey)
		return s
	}
	var errs []error
	var err error
	if s.out.Set, err = osimage.ParseServed([]byte(doc)); err != nil {
		errs = append(errs, fmt.Errorf("%s: %w", osimage.ValuesKey, err))
	}
	if files, ok := src.Data[osimage.ServedFilenamesKey]; ok {
		s.hasFilenames = true
		if s.out.Filenames, err = osimage.ParseServedFilenames([]byte(files)); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", osimage.ServedFilenamesKey, err))
		}
	}
	if oci, ok := src.Data[osimage.ServedOCIKey]; ok {
		s.hasOCI = true
		if s.out.OCI, err = osimage.ParseServedOCI([]byte(oci)); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", osimage.ServedOCIKey, err))
		}
	}
	if refused, ok := src.Data[osimage.RefusedNeedsKey]; ok {
		s.hasRefused = true
		if s.out.Refused, err = osimage.ParseRefusedNeeds([]byte(refused)); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", osimage.RefusedNeedsKey, err))
		}
	}
	if s.err = errors.Join(errs...); s.err != nil {
		return ServedSource{err: s.err}
	}
	for k, v := range src.Data {
		switch k {
		case osimage.ValuesKey, osimage.ServedFilenamesKey, osimage.ServedOCIKey, osimage.RefusedNeedsKey:
		default:
			if s.other == nil {
				s.other = map[string]string{}
			}
			s.other[k] = v
		}
	}
	s.binary = src.BinaryData
	return s
}

// Picks are the sha256s of the served set that one namespace can use.
type Picks struct {
	SHA256s map[osimage.SHA256]bool
	// Note says where they come from, or why there are none.
	Note string
	// Unreadable is set when the catalog exists but cannot be read.
	Unreadable error
}

// CatalogSHA256s reads the sha256s that catalog, an os-images-info
// ConfigMap, names. An image without a valid sha256 names none (render
// refuses to pick it). A document that does not parse is an error, as it
// is to render.
func CatalogSHA256s(catalog *corev1.ConfigMap) (map[osimage.SHA256]bool, error) {
	doc, ok := catalog.Data[osimage.ValuesKey]
	if !ok {
		return nil, fmt.Errorf("it has no data key %s", osimage.ValuesKey)
	}
	cat, err := osimage.ParseInfo([]byte(doc))
	if err != nil {
		return nil, err
	}
	out := make(map[osimage.SHA256]bool, len(cat))
	for _, img := range cat {
		if sha, err := img.SHA256(); err == nil {
			out[sha] = true
		}
	}
	return out, nil
}

// StatusSHA256s reads the sha256s of the images the fleet check found the
// namespace's clusters need, from its osimages-status ConfigMap; nothing
// from one the check did not write (no osimage.StatusLabel) or that does not
// parse.
func StatusSHA256s(status *corev1.ConfigMap) map[osimage.SHA256]bool {
	if _, ours := status.Labels[osimage.StatusLabel]; !ours {
		return nil
	}
	report, err := osimage.ParseCheckReport(status.Data[osimage.StatusKey])
	if err != nil {
		return nil
	}
	out := make(map[osimage.SHA256]bool, len(report.Images))
	for _, img := range report.Images {
		out[img.SHA256] = true
	}
	return out
}

// NewPicks puts together what a namespace can use: the sha256s of its
// catalog (catalogName; catalog nil when it has none, catalogErr when it
// cannot be read) and those of its status (nil when none).
func NewPicks(catalogName string, catalog map[osimage.SHA256]bool, catalogFound bool, catalogErr error, needed map[osimage.SHA256]bool) Picks {
	p := Picks{SHA256s: make(map[osimage.SHA256]bool, len(catalog)+len(needed))}
	maps.Copy(p.SHA256s, catalog)
	maps.Copy(p.SHA256s, needed)
	switch {
	case catalogErr != nil:
		p.Unreadable = fmt.Errorf("ConfigMap %s cannot be read: %w", catalogName, catalogErr)
		p.Note = clip.String(p.Unreadable.Error(), notesMax)
	case !catalogFound:
		p.Note = fmt.Sprintf("no ConfigMap %s in the namespace", catalogName)
	default:
		p.Note = fmt.Sprintf("%d sha256s named by ConfigMap %s", len(catalog), catalogName)
	}
	if len(needed) > 0 {
		p.Note += fmt.Sprintf(", %d needed by %s", len(needed), osimage.StatusConfigMapName)
	}
	return p
}

// cut returns the entries of m whose sha256 keep holds (never nil: an
// empty document, not a missing one, says nothing is kept).
func cut[M ~map[osimage.SHA256]V, V any, K ~map[osimage.SHA256]W, W any](m M, keep K) M {
	out := make(M, min(len(m), len(keep)))
	for sha := range keep {
		if v, ok := m[sha]; ok {
			out[sha] = v
		}
	}
	return out
}

// Filtered returns the data of the copy for namespace, and the note of
// AnnotationPicks: every key of the source, with the served set and its
// filenames cut down to the entries whose sha256 p holds, and the refused
// needs to those of namespace (the check reads no other). A source that is
// not a served set gives an empty served set: nothing can be vouched for.
func (s ServedSource) Filtered(namespace string, p Picks) (map[string]string, map[string][]byte, string, error) {
	if s.err != nil {
		empty, err := osimage.MarshalServed(nil)
		if err != nil {
			return nil, nil, "", err
		}
		note := clip.String(fmt.Sprintf("the source is not a served set (%v); no entry kept", s.err), notesMax)
		return map[string]string{osimage.ValuesKey: string(empty)}, nil, note, nil
	}
	set := cut(s.out.Set, p.SHA256s)
	data := make(map[string]string, len(s.other)+3)
	maps.Copy(data, s.other)
	doc, err := osimage.MarshalServed(set)
	if err != nil {
		return nil, nil, "", err
	}
	data[osimage.ValuesKey] = string(doc)
	if s.hasFilenames {
		doc, err := osimage.MarshalServedFilenames(cut(s.out.Filenames, set))
		if err != nil {
			return nil, nil, "", err
		}
		data[osimage.ServedFilenamesKey] = string(doc)
	}
	if s.hasOCI {
		doc, err := osimage.MarshalServedOCI(cut(s.out.OCI, set))
		if err != nil {
			return nil, nil, "", err
		}
		data[osimage.ServedOCIKey] = string(doc)
	}
	if s.hasRefused {
		// Every refusal of the namespace stays, whatever its sha256: one
		// of "" refuses all its needs, and the check looks a refusal up
		// by the sha256 a template names, which may be in no catalog.
		var mine osimage.RefusedNeeds
		for _, r := range s.out.Refused {
			if r.Namespace == namespace {
				mine = append(mine, r)
			}
		}
		// The server writes the key only when something is refused.
		if len(mine) > 0 {
			doc, err := osimage.MarshalRefusedNeeds(mine)
			if err != nil {
				return nil, nil, "", err
			}
			data[osimage.RefusedNeedsKey] = string(doc)
		}
	}
	// Not the size of the served set: a change that adds nothing to this
	// copy must not rewrite it.
	note := fmt.Sprintf("%s; %d served entries kept", p.Note, len(set))
	return data, cloneBinary(s.binary), note, nil
}
