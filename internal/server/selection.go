// Package server is the image server of the management cluster: it selects
// the images to serve from the management cluster's own values, has them
// pulled and verified into content-addressed storage, serves them over HTTP
// to Ironic, and publishes what it serves (contract §6).
package server

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/opencontainers/go-digest"

	"github.com/sylva-projects/osimages/internal/catalog"
	"github.com/sylva-projects/osimages/internal/imagestore"
	"github.com/sylva-projects/osimages/internal/levels"
	"github.com/sylva-projects/osimages/internal/oci"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/pull"
	"github.com/sylva-projects/osimages/internal/selector"
	"github.com/sylva-projects/osimages/internal/signature"
	"github.com/sylva-projects/osimages/internal/values"
)

// Wanted is one image the server must serve.
type Wanted struct {
	SHA256 string
	// Key is the image's key in the management cluster's os_images; when
	// several keys name the same file, the first in sort order.
	Key   string
	Image osimage.Image
	// SelectedBy names the selectors that matched it, for operators.
	SelectedBy []string
	// Filenames are every filename that a key of the management os_images
	// gives this sha256, sorted: the one stored file is served under each,
	// so that a second key with another filename never moves a URL.
	Filenames []string
}

// Filename is the filename of the image's record (that of Key).
func (w Wanted) Filename() string { return w.Image.Get(osimage.FieldFilename) }

// ServedAs returns the filenames the image is served under: Filenames, or
// the record's own filename for an image known only from the store.
func (w Wanted) ServedAs() []string {
	if len(w.Filenames) > 0 {
		return w.Filenames
	}
	if name := w.Filename(); name != "" {
		return []string{name}
	}
	return nil
}

// servedFile tells which file of an image a request names: one of its
// filenames, or the .sha256sum or .md5sum of one (suffix). The filename
// itself wins over a checksum reading of it.
func servedFile(names []string, file string) (name, suffix string, ok bool) {
	if slices.Contains(names, file) {
		return file, "", true
	}
	for _, suffix := range []string{".sha256sum", ".md5sum"} {
		if name, cut := strings.CutSuffix(file, suffix); cut && slices.Contains(names, name) {
			return name, suffix, true
		}
	}
	return "", "", false
}

// Int64Field reads a size field, 0 when absent or malformed; a download
// refuses malformed sizes before it asks for them (Server.bounds).
func (w Wanted) Int64Field(field string) int64 {
	n, _ := w.Image.Size(field)
	return n
}

// AdditionalSelectorsKey names the map of extra selectors in the management
// values: name -> selector, used as written (not finalized).
const AdditionalSelectorsKey = "os_image_server_additional_selectors"

// Select computes the served set: every image of cat that one of the
// management cluster's own finalized level selectors (or image_key) designates,
// or that an additional selector matches. It returns what it could select
// together with the faults of the rest, so that one bad selector never stops
// the images of the others from being served. Images that cannot be served
// (no sha256 or filename) are faults too. Each image selected is served
// under every filename that a key of cat gives its sha256, selected or not:
// it is the same file.
func Select(mgmt values.Values, cat osimage.Catalog) (map[string]Wanted, error) {
	var errs []error
	type match struct{ by string }
	byKey := map[string][]string{}
	add := func(key, by string) { byKey[key] = append(byKey[key], by) }

	choices, err := levels.Choices(mgmt)
	if err != nil {
		errs = append(errs, err)
	}
	for _, path := range slices.Sorted(maps.Keys(choices)) {
		c := choices[path]
		if c.Selector != nil {
			keys, err := c.Selector.Select(cat)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", path, err))
				continue
			}
			for _, key := range keys {
				if c.ImageKey == "" || c.ImageKey == key {
					add(key, path)
				}
			}
			continue
		}
		if _, ok := cat[c.ImageKey]; !ok {
			errs = append(errs, fmt.Errorf("%s: nothing in os_images for image_key %s", path, c.ImageKey))
			continue
		}
		add(c.ImageKey, path)
	}

	extra, err := values.Map(mgmt, AdditionalSelectorsKey, "."+AdditionalSelectorsKey)
	if err != nil {
		errs = append(errs, err)
	}
	for _, name := range slices.Sorted(maps.Keys(extra)) {
		path := "." + AdditionalSelectorsKey + "." + name
		sel, err := selector.Parse(extra[name], path)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		keys, err := sel.Select(cat)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", path, err))
			continue
		}
		for _, key := range keys {
			add(key, path)
		}
	}

	out := map[string]Wanted{}
	for _, key := range slices.Sorted(maps.Keys(byKey)) {
		img := cat[key]
		sha, err := img.SHA256()
		if err != nil {
			errs = append(errs, fmt.Errorf("os_images.%s: cannot be served: it has no valid sha256: %w", key, err))
			continue
		}
		sum := string(sha)
		if _, err := img.Filename(); err != nil {
			errs = append(errs, fmt.Errorf("os_images.%s: cannot be served: %w", key, err))
			continue
		}
		if prev, ok := out[sum]; ok {
			prev.SelectedBy = append(prev.SelectedBy, byKey[key]...)
			out[sum] = prev
			continue
		}
		out[sum] = Wanted{SHA256: sum, Key: key, Image: img, SelectedBy: byKey[key]}
	}
	for _, key := range cat.Keys() {
		sha, err := cat[key].SHA256()
		if err != nil {
			continue
		}
		w, ok := out[string(sha)]
		name, err := cat[key].Filename()
		if !ok || err != nil || slices.Contains(w.Filenames, name) {
			continue
		}
		w.Filenames = append(w.Filenames, name)
		slices.Sort(w.Filenames)
		out[string(sha)] = w
	}
	return out, errors.Join(errs...)
}

// PullWith adapts a puller to a PullFunc. choose is asked for the puller at
// each pull, since oci_registry_insecure can change with the values; trust
// likewise gives the cosign keys of the management values in force. Before
// any byte of an OCI image is downloaded, the manifest the tag resolves to
// must be the one the image record pins (oci-manifest-digest), and must
// carry a signature made with every key that applies to the image
// (catalog.Trust.KeysFor). While trust reports an error, OCI images are not
// pulled at all. A nil trust checks no signature (the demo, which has no
// keys).
func PullWith(choose func() *pull.Puller, trust func() (catalog.Trust, error)) PullFunc {
	return func(ctx context.Context, w Wanted, dst *imagestore.Writer, progress func(int64, int64)) (string, int64, error) {
		src := PullSource(w)
		if trust != nil {
			check, err := signatureCheck(w, trust)
			if err != nil {
				return "", 0, err
			}
			src.CheckManifest = check
		}
		res, err := choose().Pull(ctx, src, dst, progress)
		return res.MD5, res.Size, err
	}
}

// signatureCheck is the check of w's manifest that the management values
// ask for, nil when no key applies to it.
func signatureCheck(w Wanted, trust func() (catalog.Trust, error)) (func(context.Context, *oci.Client, digest.Digest) error, error) {
	uri := w.Image.Get(osimage.FieldURI)
	if !strings.HasPrefix(uri, "oci://") {
		return nil, nil
	}
	t, err := trust()
	if err != nil {
		return nil, fmt.Errorf("pulling %s: not pulled, since the cosign keys that apply to it cannot be read from the management values: %w", uri, err)
	}
	keys, err := t.KeysRequired(w.Image.Get(osimage.FieldRegistryKey), uri)
	if err != nil {
		return nil, fmt.Errorf("%w (nothing was downloaded)", err)
	}
	if len(keys) == 0 {
		return nil, nil
	}
	parsed := make([]*signature.PublicKey, len(keys))
	for i, k := range keys {
		if parsed[i], err = signature.ParsePublicKey([]byte(k.PublicKey)); err != nil {
			return nil, fmt.Errorf("pulling %s: %s: %w", uri, k.Path(), err)
		}
	}
	return func(ctx context.Context, client *oci.Client, d digest.Digest) error {
		for i, key := range parsed {
			err := signature.Verifier{Client: client}.Verify(ctx, uri, d, key)
			var refused *signature.Error
			if errors.As(err, &refused) {
				return fmt.Errorf("%w (key from %s of the management values; nothing was downloaded)", err, keys[i].Path())
			}
			if err != nil {
				return fmt.Errorf("verifying the signature: %w", err)
			}
		}
		return nil
	}, nil
}

// PullSource is what the puller needs to know of w.
func PullSource(w Wanted) pull.Source {
	return pull.Source{
		URI:            w.Image.Get(osimage.FieldURI),
		SHA256:         w.SHA256,
		MD5:            w.Image.Get(osimage.FieldMD5),
		Compression:    w.Image.Get(osimage.FieldCompression),
		Size:           w.Int64Field(osimage.FieldSize),
		ArchiveSize:    w.Int64Field(osimage.FieldArchiveSize),
		ManifestDigest: w.Image.Get(osimage.FieldManifestDigest),
	}
}

// ValuesNearMisses reports the near-misses (values.NearMiss) of the keys
// selection and the signature policy read in the management values: at the
// top, in each capm3 level (os_image_selector, image_key), and those of
// os_images_oci_registries and security. A misspelt
// os_image_server_additional_selectors would otherwise silently drop every
// image it selects.
func ValuesNearMisses(mgmt values.Values) []error {
	errs := values.NearMisses(mgmt, "", AdditionalSelectorsKey, "capm3", "control_plane", "machine_deployment_default",
		"machine_deployments", "k8s_version", "capi_providers", "os_image_selector_autoselect_registries")
	level := func(m any, path string) {
		if lv, ok := m.(map[string]any); ok {
			errs = append(errs, values.NearMisses(lv, path, "os_image_selector", "image_key")...)
		}
	}
	holder := func(m any, path string) {
		if h, ok := m.(map[string]any); ok {
			errs = append(errs, values.NearMisses(h, path, "capm3")...)
			level(h["capm3"], path+".capm3")
		}
	}
	level(mgmt["capm3"], ".capm3")
	holder(mgmt["control_plane"], ".control_plane")
	holder(mgmt["machine_deployment_default"], ".machine_deployment_default")
	if mds, ok := mgmt["machine_deployments"].(map[string]any); ok {
		for _, name := range slices.Sorted(maps.Keys(mds)) {
			holder(mds[name], ".machine_deployments."+name)
		}
	}
	return append(errs, catalog.TrustNearMisses(mgmt)...)
}
