package signature

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/opencontainers/go-digest"

	"github.com/sylva-projects/osimages/internal/oci"
)

// The values paths of the two switches of the policy (contract §2).
const (
	// SkipPath turns signature checks off.
	SkipPath = "security.os_images.skip_signing_check"
	// RequirePath refuses every OCI image that no configured key verifies.
	RequirePath = "security.os_images.require_signatures"
)

// Key is the cosign key of a registry (os_images_oci_registries): the
// images under it must carry a signature made with it.
type Key struct {
	// Registry is the os_images_oci_registries key.
	Registry string `json:"registry"`
	// URL is the registry's url, rendered; "" when it could not be.
	URL string `json:"-"`
	// PublicKey is the PEM of cosign_publickey.
	PublicKey string `json:"publicKey"`

	parsed *PublicKey
}

// NewKey reads the PEM of registry's cosign_publickey, once: a Key built
// by NewKey never parses it again.
func NewKey(registry, url, pem string) (Key, error) {
	k := Key{Registry: registry, URL: url, PublicKey: strings.TrimSpace(pem)}
	parsed, err := ParsePublicKey([]byte(k.PublicKey))
	if err != nil {
		return Key{}, err
	}
	k.parsed = parsed
	return k, nil
}

// Path is the values path of the key, for messages that tell how to fix it.
func (k Key) Path() string {
	return "os_images_oci_registries." + k.Registry + ".cosign_publickey"
}

// publicKey is the parsed key; a Key not built by NewKey is parsed here.
func (k Key) publicKey() (*PublicKey, error) {
	if k.parsed != nil {
		return k.parsed, nil
	}
	parsed, err := ParsePublicKey([]byte(k.PublicKey))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", k.Path(), err)
	}
	return parsed, nil
}

// Policy is what a set of values says about signatures (contract §2): the
// cosign key of each registry that has one, and whether the check is off
// or unsigned images refused. The catalog and the image server read it
// from their own values and apply the same rule.
type Policy struct {
	// Skip is security.os_images.skip_signing_check.
	Skip bool
	// Require is security.os_images.require_signatures: an OCI image that
	// no key applies to is refused rather than taken unchecked.
	Require bool
	// Keys are the keys of the registries that have one, sorted by
	// registry.
	Keys []Key
}

// KeysFor returns the keys an image must be signed with: that of the
// registry the image record names (oci-image-registry-key), and that of
// every registry whose url the image's URI lives under (oci.Under, the
// rule the fleet's needs are admitted by too). The second rule means that
// a hand-declared os_images entry, or a record whose registry key was
// edited away, cannot take an image of a signed registry around the
// check. Hosts compare in their canonical form (oci.CanonicalHost), so
// that localhost, 127.0.0.1, [::ffff:127.0.0.1] or an upper-case or
// default-port spelling of a keyed registry is that registry. Nil when the
// check is off or no key applies.
func (p Policy) KeysFor(registryKey, uri string) Keys {
	if p.Skip {
		return nil
	}
	if !strings.HasPrefix(uri, "oci://") {
		return nil
	}
	var out Keys
	for _, k := range p.Keys {
		if k.Registry == registryKey || oci.Under(uri, k.URL) {
			out = append(out, k)
		}
	}
	return out
}

// KeysRequired is KeysFor, with the refusal of an OCI image that no key
// applies to when Require is set. The catalog and the image server both
// apply it before any request for the image.
func (p Policy) KeysRequired(registryKey, uri string) (Keys, error) {
	keys := p.KeysFor(registryKey, uri)
	if len(keys) == 0 && p.Require && !p.Skip && strings.HasPrefix(uri, "oci://") {
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

// KeyVerifier checks that manifest d of uri's repository is signed with
// key; Verifier is one.
type KeyVerifier interface {
	Verify(ctx context.Context, uri string, d digest.Digest, key *PublicKey) error
}

// Keys are the keys that apply to one image (Policy.KeysFor).
type Keys []Key

// Check verifies that manifest d of uri carries a signature made with
// each key. A refusal keeps Sylva's words ("Invalid signature for <uri>",
// a *Error), and says which key refused it and then advice, what the
// caller's operator can do about it. Other errors (the registry cannot be
// read) say nothing about the signature.
func (keys Keys) Verify(ctx context.Context, v KeyVerifier, uri string, d digest.Digest, advice string) error {
	for _, k := range keys {
		key, err := k.publicKey()
		if err != nil {
			return err
		}
		if v == nil {
			return fmt.Errorf("Invalid signature for %s: no signature verifier configured, and %s is set", uri, k.Path())
		}
		err = v.Verify(ctx, uri, d, key)
		var refused *Error
		if errors.As(err, &refused) {
			return fmt.Errorf("%w (key from %s%s)", err, k.Path(), advice)
		}
		if err != nil {
			return fmt.Errorf("verifying the signature: %w", err)
		}
	}
	return nil
}
