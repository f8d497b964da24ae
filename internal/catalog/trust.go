package catalog

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/sylva-projects/osimages/internal/oci"
	"github.com/sylva-projects/osimages/internal/signature"
	"github.com/sylva-projects/osimages/internal/values"
)

// Trust is what the values say about signatures (contract §2): the cosign
// public key of each registry that has one, and whether the check is off.
// The catalog and the image server read it from their own values and apply
// the same rule (KeysFor).
type Trust struct {
	// Skip is security.os_images.skip_signing_check.
	Skip bool
	// Require is security.os_images.require_signatures: an OCI image that
	// no key applies to is refused rather than taken unchecked.
	Require bool
	// Registries are the os_images_oci_registries entries with a non-empty
	// cosign_publickey, sorted by key.
	Registries []SigningKey
}

// SigningKey is the cosign key of a registry: its images must carry a
// signature made with it.
type SigningKey struct {
	// Registry is the os_images_oci_registries key.
	Registry string `json:"registry"`
	// URL is the registry's url, rendered; "" when it could not be.
	URL string `json:"-"`
	// PublicKey is the PEM of cosign_publickey.
	PublicKey string `json:"publicKey"`
}

// Path is the values path of the key, for messages that tell how to fix it.
func (s SigningKey) Path() string {
	return "os_images_oci_registries." + s.Registry + ".cosign_publickey"
}

// SkipPath is the values path of the switch that turns signature checks off.
const SkipPath = "security.os_images.skip_signing_check"

// RequirePath is the values path of the switch that refuses every OCI
// image no configured key verifies.
const RequirePath = "security.os_images.require_signatures"

// KeysFor returns the keys an image must be signed with: that of the
// registry the image record names (oci-image-registry-key), and that of
// every registry whose url the image's URI lives under. The second rule
// means that a hand-declared os_images entry, or a record whose registry
// key was edited away, cannot take an image of a signed registry around
// the check. Hosts compare in their canonical form (oci.CanonicalHost), so
// that localhost, 127.0.0.1, [::ffff:127.0.0.1] or an upper-case or
// default-port spelling of a keyed registry is that registry. Nil when the
// check is off or no key applies.
func (t Trust) KeysFor(registryKey, uri string) []SigningKey {
	if t.Skip {
		return nil
	}
	repo, ok := oci.CanonicalRepository(uri)
	if !ok {
		return nil
	}
	var out []SigningKey
	for _, s := range t.Registries {
		if s.Registry == registryKey || under(repo, s.URL) {
			out = append(out, s)
		}
	}
	return out
}

// under says whether the repository (canonical) lives under the registry
// url.
func under(repo, url string) bool {
	base, ok := oci.CanonicalRepository(url)
	return ok && (repo == base || strings.HasPrefix(repo, base+"/"))
}

// KeysRequired is KeysFor, with the refusal of an OCI image that no key
// applies to when Require is set. The catalog and the image server both
// apply it.
func (t Trust) KeysRequired(registryKey, uri string) ([]SigningKey, error) {
	keys := t.KeysFor(registryKey, uri)
	if len(keys) == 0 && t.Require && !t.Skip && strings.HasPrefix(uri, "oci://") {
		return nil, UnsignedError(uri)
	}
	return keys, nil
}

// UnsignedError is the refusal of an OCI image that no key applies to
// while signatures are required.
func UnsignedError(uri string) error {
	return fmt.Errorf("Invalid signature for %s: no cosign_publickey of os_images_oci_registries applies to it, and %s is true; "+
		"give its registry a key (its url must be a prefix of the image URI), or declare it with https://", uri, RequirePath)
}

// Keys counts the registries that have a key, skipped or not.
func (t Trust) Keys() int { return len(t.Registries) }

// TrustFromValues reads the cosign keys of os_images_oci_registries and
// security.os_images.skip_signing_check. Every fault is reported with its
// values path; the image server refuses to pull OCI images while the trust
// cannot be read, rather than pull them unchecked.
func TrustFromValues(v values.Values) (Trust, error) {
	regs, err := registriesFromValues(values.NewRenderer(context.Background(), v), v, false)
	skip, require, policyErr := signaturePolicy(v)
	var errs []error
	for _, e := range []error{err, policyErr} {
		if e != nil {
			errs = append(errs, e)
		}
	}
	if len(errs) > 0 {
		return Trust{}, &InputError{Errs: errs}
	}
	return trustOf(regs, skip, require), nil
}

func trustOf(regs map[string]registry, skip, require bool) Trust {
	t := Trust{Skip: skip, Require: require}
	for _, key := range slices.Sorted(maps.Keys(regs)) {
		if r := regs[key]; r.cosignKey != "" {
			t.Registries = append(t.Registries, SigningKey{Registry: key, URL: r.url, PublicKey: r.cosignKey})
		}
	}
	return t
}

// signaturePolicy reads skip_signing_check and require_signatures, which
// contradict each other when both are true.
func signaturePolicy(v values.Values) (skip, require bool, err error) {
	security, err := values.Map(v, "security", "security")
	if err != nil {
		return false, false, err
	}
	osImages, err := values.Map(security, "os_images", "security.os_images")
	if err != nil {
		return false, false, err
	}
	skip, e1 := values.Bool(osImages, "skip_signing_check", SkipPath, false)
	require, e2 := values.Bool(osImages, "require_signatures", RequirePath, false)
	if err := errors.Join(e1, e2); err != nil {
		return false, false, err
	}
	if skip && require {
		return false, false, fmt.Errorf("%s and %s are both true: choose one (require refuses unsigned images, skip checks none)", SkipPath, RequirePath)
	}
	return skip, require, nil
}

// cosignKey reads and checks a registry's cosign_publickey, so that a
// broken key is a values error (exit 2) rather than a refusal of every
// image. It returns the PEM trimmed, "" when there is none.
func cosignKey(entry values.Values, path string) (string, error) {
	s, err := values.String(entry, "cosign_publickey", path+".cosign_publickey")
	if err != nil {
		return "", err
	}
	s = strings.TrimSpace(s)
	if s == "" {
		return "", nil
	}
	if _, err := signature.ParsePublicKey([]byte(s)); err != nil {
		return "", fmt.Errorf("%s.cosign_publickey: %w", path, err)
	}
	return s, nil
}
