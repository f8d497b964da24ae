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
	"strconv"
	"strings"

	"github.com/opencontainers/go-digest"

	"github.com/sylva-projects/osimages/internal/capm3"
	"github.com/sylva-projects/osimages/internal/catalog"
	"github.com/sylva-projects/osimages/internal/imagestore"
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
}

// Filename is the name the image is served under.
func (w Wanted) Filename() string { return w.Image.Get(osimage.FieldFilename) }

// Int64Field reads a size field, 0 when absent or malformed.
func (w Wanted) Int64Field(field string) int64 {
	n, _ := strconv.ParseInt(w.Image.Get(field), 10, 64)
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
// (no sha256 or filename) are faults too.
func Select(mgmt values.Values, cat osimage.Catalog) (map[string]Wanted, error) {
	var errs []error
	type match struct{ by string }
	byKey := map[string][]string{}
	add := func(key, by string) { byKey[key] = append(byKey[key], by) }

	choices, err := capm3.LevelChoices(mgmt)
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
	keys := t.KeysFor(w.Image.Get(osimage.FieldRegistryKey), uri)
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
