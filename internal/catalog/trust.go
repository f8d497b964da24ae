package catalog

import (
	"fmt"
	"maps"
	"slices"
	"strings"

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

// KeysFor returns the keys an image must be signed with: that of the
// registry the image record names (oci-image-registry-key), and that of
// every registry whose url the image's URI lives under. The second rule
// means that a hand-declared os_images entry, or a record whose registry
// key was edited away, cannot take an image of a signed registry around
// the check. Nil when the check is off or no key applies.
func (t Trust) KeysFor(registryKey, uri string) []SigningKey {
	if t.Skip || !strings.HasPrefix(uri, "oci://") {
		return nil
	}
	var out []SigningKey
	for _, s := range t.Registries {
		under := s.URL != "" && strings.HasPrefix(uri, strings.TrimSuffix(s.URL, "/")+"/")
		if s.Registry == registryKey || under {
			out = append(out, s)
		}
	}
	return out
}

// Keys counts the registries that have a key, skipped or not.
func (t Trust) Keys() int { return len(t.Registries) }

// TrustFromValues reads the cosign keys of os_images_oci_registries and
// security.os_images.skip_signing_check. Every fault is reported with its
// values path; the image server refuses to pull OCI images while the trust
// cannot be read, rather than pull them unchecked.
func TrustFromValues(v values.Values) (Trust, error) {
	regs, err := registriesFromValues(v, false)
	skip, skipErr := skipSigningCheck(v)
	if err != nil || skipErr != nil {
		var errs []error
		if err != nil {
			errs = append(errs, err)
		}
		if skipErr != nil {
			errs = append(errs, skipErr)
		}
		return Trust{}, &InputError{Errs: errs}
	}
	return trustOf(regs, skip), nil
}

func trustOf(regs map[string]registry, skip bool) Trust {
	t := Trust{Skip: skip}
	for _, key := range slices.Sorted(maps.Keys(regs)) {
		if r := regs[key]; r.cosignKey != "" {
			t.Registries = append(t.Registries, SigningKey{Registry: key, URL: r.url, PublicKey: r.cosignKey})
		}
	}
	return t
}

func skipSigningCheck(v values.Values) (bool, error) {
	security, err := values.Map(v, "security", "security")
	if err != nil {
		return false, err
	}
	osImages, err := values.Map(security, "os_images", "security.os_images")
	if err != nil {
		return false, err
	}
	return values.Bool(osImages, "skip_signing_check", SkipPath, false)
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
