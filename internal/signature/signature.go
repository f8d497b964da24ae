// Package signature verifies cosign key-based signatures of OCI artifacts,
// as `cosign verify --key K --insecure-ignore-tlog=true` does, which is what
// Sylva's os-images-info job runs on diskimage-builder artifacts.
//
// A cosign signature of manifest sha256:<hex> in repository R is the
// manifest tagged sha256-<hex>.sig in R (or, with cosign's OCI 1.1 referrers
// mode, a manifest of artifact type application/vnd.dev.cosign.artifact.sig.v1+json
// whose subject is the signed manifest). Each of its layers of media type
// application/vnd.dev.cosign.simplesigning.v1+json is one signature: the
// layer blob is the signed payload, a "simple signing" JSON document naming
// the signed manifest digest, and the layer annotation
// dev.cosignproject.cosign/signature is the base64 signature of that blob.
//
// Verification needs one of those layers whose blob matches its digest, whose
// signature verifies with the key, and whose payload names the manifest
// digest that was resolved. No transparency log is consulted, and the
// payload's docker-reference is not compared (cosign does not either, so that
// signed artifacts can be copied between registries).
//
// cosign v3 writes a Sigstore bundle by default instead (bundle.go): a
// referrer whose layer is a bundle signing an in-toto statement about the
// manifest. Both formats are read; one valid signature in either is enough.
//
// The cryptography is sigstore's (github.com/sigstore/sigstore), the bundle
// format that of github.com/sigstore/protobuf-specs; this package only finds
// the signatures and checks what they say.
package signature

import (
	"bytes"
	"context"
	"crypto"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/sigstore/sigstore/pkg/cryptoutils"
	sigsig "github.com/sigstore/sigstore/pkg/signature"
	"github.com/sigstore/sigstore/pkg/signature/payload"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/errdef"
	"oras.land/oras-go/v2/registry"
	"oras.land/oras-go/v2/registry/remote/errcode"

	"github.com/sylva-projects/osimages/internal/oci"
)

// The cosign format (github.com/sigstore/cosign pkg/types and pkg/oci).
const (
	// SimpleSigningMediaType is the media type of a layer holding a signed
	// payload.
	SimpleSigningMediaType = "application/vnd.dev.cosign.simplesigning.v1+json"
	// SignatureAnnotation holds the base64 signature of the layer's blob.
	SignatureAnnotation = "dev.cosignproject.cosign/signature"
	// ReferrerArtifactType is the artifact type of a signature attached with
	// cosign's OCI 1.1 referrers mode.
	ReferrerArtifactType = "application/vnd.dev.cosign.artifact.sig.v1+json"
)

// Bounds on what is read from a registry for one verification: cosign
// payloads are a few hundred bytes, and a signature manifest has one layer.
// The referrers listed are bounded by oci.MaxReferrers, and every signature
// among them is tried: a re-signed artifact keeps its old signatures, by
// keys since rotated, and the valid one may come last.
const (
	maxPayloadBytes = 64 << 10
	maxLayers       = 32
)

// PublicKey is a cosign public key (PEM, as cosign_publickey holds it),
// ready to verify signatures.
type PublicKey struct {
	verifier    sigsig.Verifier
	fingerprint string
}

// ParsePublicKey reads a PEM public key: ECDSA (cosign's default, P-256),
// RSA or Ed25519, as `cosign public-key` or `cosign generate-key-pair`
// writes it.
func ParsePublicKey(pemData []byte) (*PublicKey, error) {
	pemData = bytes.TrimSpace(pemData)
	if len(pemData) == 0 {
		return nil, errors.New("empty public key")
	}
	pub, err := cryptoutils.UnmarshalPEMToPublicKey(pemData)
	if err != nil {
		return nil, fmt.Errorf("not a PEM public key (want the -----BEGIN PUBLIC KEY----- block of cosign.pub): %w", err)
	}
	if err := cryptoutils.ValidatePubKey(pub); err != nil {
		return nil, fmt.Errorf("public key refused: %w", err)
	}
	// cosign signs and verifies with SHA-256 unless told otherwise
	// (--signature-digest-algorithm, deprecated); Ed25519 ignores it.
	v, err := sigsig.LoadVerifier(pub, crypto.SHA256)
	if err != nil {
		return nil, fmt.Errorf("public key: %w", err)
	}
	der, err := cryptoutils.MarshalPublicKeyToDER(pub)
	if err != nil {
		return nil, fmt.Errorf("public key: %w", err)
	}
	sum := sha256.Sum256(der)
	return &PublicKey{verifier: v, fingerprint: hex.EncodeToString(sum[:8])}, nil
}

// Fingerprint names the key in messages: the first 16 hex digits of the
// sha256 of its DER encoding (`openssl pkey -pubin -outform der | sha256sum`).
func (k *PublicKey) Fingerprint() string { return k.fingerprint }

// Reason is why a signature is refused. Test for one with errors.Is.
type Reason string

// The reasons a signature is refused. Other errors (the registry cannot be
// reached, a timeout) are not verdicts: the caller may try again.
const (
	ErrNoSignature Reason = "no signature found"
	ErrOtherKey    Reason = "signed by another key"
	ErrOtherDigest Reason = "the signed payload names another manifest digest"
	ErrMalformed   Reason = "malformed signature"
	// ErrTooManyReferrers: none of the signatures read verifies, and the
	// manifest has more referrers than oci.MaxReferrers, so some were not
	// read.
	ErrTooManyReferrers Reason = "too many referrers"
)

func (r Reason) Error() string { return string(r) }

// Error is a refused signature. Its message starts with Sylva's words,
// "Invalid signature for <uri>", which operators grep for.
type Error struct {
	// URI is the image as the user named it (oci://host/repo:tag).
	URI string
	// Digest is the manifest digest that was to be verified.
	Digest digest.Digest
	Reason Reason
	// Detail says what was found, and where.
	Detail string
}

func (e *Error) Error() string {
	return fmt.Sprintf("Invalid signature for %s: %s: %s", e.URI, e.Reason, e.Detail)
}

// Unwrap makes errors.Is(err, ErrOtherKey) and the like work.
func (e *Error) Unwrap() error { return e.Reason }

// Verifier verifies signatures in registries reached through an oci.Client
// (its credentials, CA, proxy, retries and insecure setting).
type Verifier struct {
	Client *oci.Client
}

// Verify checks that manifest d of the repository of uri (oci://host/repo:tag
// or @digest) carries a cosign signature made with key. It returns nil, a
// *Error with the reason of a refusal, or another error when the registry
// could not be read (which says nothing about the signature).
func (v Verifier) Verify(ctx context.Context, uri string, d digest.Digest, key *PublicKey) error {
	if key == nil {
		return errors.New("no public key given")
	}
	if err := d.Validate(); err != nil {
		return fmt.Errorf("manifest digest %q: %w", d, err)
	}
	ref, err := oci.ParseReference(uri)
	if err != nil {
		return err
	}
	refuse := func(reason Reason, format string, args ...any) error {
		return &Error{URI: uri, Digest: d, Reason: reason, Detail: fmt.Sprintf(format, args...)}
	}

	var checked []verdict
	sigTag := d.Algorithm().String() + "-" + d.Encoded() + ".sig"
	tagRef := ref
	tagRef.Reference = sigTag
	m, err := v.Client.FetchManifest(ctx, "oci://"+tagRef.String())
	switch {
	case err == nil:
		vs, ok := v.checkManifest(ctx, ref, m, d, key)
		if ok {
			return nil
		}
		checked = append(checked, verdictsIn("tag "+sigTag, m, SimpleSigningMediaType, vs)...)
	case errors.Is(err, errdef.ErrNotFound) || isNotFound(err):
		// Signed in referrers mode, or not signed: look at the referrers.
	default:
		return fmt.Errorf("fetching the signature %s of %s: %w", sigTag, uri, err)
	}

	// Referrers are listed only when the tag did not settle it: Sylva's
	// registries hold .sig tags, and a registry without the referrers API
	// costs one more request for every image.
	all, err := v.Client.Referrers(ctx, ref, ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, Digest: d}, "")
	cut := errors.Is(err, oci.ErrTooManyReferrers)
	if err != nil && !cut && !errors.Is(err, errdef.ErrNotFound) && !errors.Is(err, errdef.ErrUnsupported) {
		return fmt.Errorf("listing the referrers of %s@%s: %w", ref.Repository, d, err)
	}
	// Both formats count: cosign's simple-signing referrers and Sigstore
	// bundles (cosign v3's default), with attestations left out.
	for _, desc := range all {
		if desc.ArtifactType != ReferrerArtifactType && !isSignatureBundle(desc) {
			continue
		}
		byDigest := ref
		byDigest.Reference = desc.Digest.String()
		where := "referrer " + desc.Digest.String()
		m, err := v.Client.FetchManifest(ctx, "oci://"+byDigest.String())
		if errors.Is(err, errdef.ErrNotFound) || isNotFound(err) {
			// Listed but gone: the referrers tag schema keeps a deleted
			// signature listed. The next one may be valid.
			checked = append(checked, verdict{where: where, reason: ErrMalformed, detail: "listed among the referrers, but the registry has no such manifest"})
			continue
		}
		if err != nil {
			return fmt.Errorf("fetching the signature referrer %s of %s: %w", desc.Digest, uri, err)
		}
		if desc.ArtifactType == ReferrerArtifactType {
			vs, ok := v.checkManifest(ctx, ref, m, d, key)
			if ok {
				return nil
			}
			checked = append(checked, verdictsIn(where, m, SimpleSigningMediaType, vs)...)
			continue
		}
		vs, ok := v.checkBundleManifest(ctx, ref, m, d, key)
		if ok {
			return nil
		}
		checked = append(checked, verdictsIn(where+" (Sigstore bundle)", m, BundleMediaTypePrefix+"*", vs)...)
	}

	if cut {
		found := fmt.Sprintf("found no signature among the first %d", oci.MaxReferrers)
		if len(checked) > 0 {
			found = fmt.Sprintf("none of the %d signatures it read verifies with the key %s (%s)", len(checked), key.Fingerprint(), describeVerdicts(checked))
		}
		return refuse(ErrTooManyReferrers, "%v; osimages %s; delete stale signatures and attestations of the artifact (their referrer manifests) so that it has at most %d referrers", err, found, oci.MaxReferrers)
	}
	if len(checked) == 0 {
		return refuse(ErrNoSignature, "no tag %s in %s/%s and no cosign signature (simple-signing or Sigstore bundle) among its referrers; sign the artifact with `cosign sign --key`", sigTag, ref.Host(), ref.Repository)
	}
	return refuse(worst(checked), "%s (key %s)", describeVerdicts(checked), key.Fingerprint())
}

// verdict is what one signature layer turned out to be.
type verdict struct {
	where  string
	reason Reason // "" for a valid one
	detail string
}

func verdictsIn(where string, m oci.Manifest, layerType string, vs []verdict) []verdict {
	if len(vs) == 0 {
		return []verdict{{where: where, reason: ErrMalformed, detail: fmt.Sprintf("manifest %s holds no %s layer", m.Descriptor.Digest, layerType)}}
	}
	for i := range vs {
		vs[i].where = where + vs[i].where
	}
	return vs
}

// worst picks the reason to report: a valid signature for another digest
// says more than a signature by another key, which says more than garbage.
func worst(vs []verdict) Reason {
	rank := map[Reason]int{ErrOtherDigest: 3, ErrOtherKey: 2, ErrMalformed: 1}
	best := ErrMalformed
	for _, v := range vs {
		if rank[v.reason] > rank[best] {
			best = v.reason
		}
	}
	return best
}

func describeVerdicts(vs []verdict) string {
	parts := make([]string, len(vs))
	for i, v := range vs {
		parts[i] = fmt.Sprintf("%s: %s", v.where, v.detail)
	}
	return strings.Join(parts, "; ")
}

// checkManifest checks every signature layer of m, and says whether one of
// them is valid.
func (v Verifier) checkManifest(ctx context.Context, ref registry.Reference, m oci.Manifest, d digest.Digest, key *PublicKey) ([]verdict, bool) {
	var out []verdict
	for i, layer := range m.Layers {
		if i >= maxLayers {
			break
		}
		if layer.MediaType != SimpleSigningMediaType {
			continue
		}
		where := fmt.Sprintf(", layer %d", i)
		reason, detail := v.checkLayer(ctx, ref, layer, d, key)
		if reason == "" {
			return nil, true
		}
		out = append(out, verdict{where: where, reason: reason, detail: detail})
	}
	return out, false
}

func (v Verifier) checkLayer(ctx context.Context, ref registry.Reference, layer ocispec.Descriptor, d digest.Digest, key *PublicKey) (Reason, string) {
	b64, ok := layer.Annotations[SignatureAnnotation]
	if !ok || b64 == "" {
		return ErrMalformed, "no " + SignatureAnnotation + " annotation"
	}
	sig, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		return ErrMalformed, "the " + SignatureAnnotation + " annotation is not base64"
	}
	// ReadBlob checks the blob against the layer's digest and size: the
	// payload verified is the one the signature manifest names.
	body, err := v.Client.ReadBlob(ctx, ref, layer, maxPayloadBytes)
	if err != nil {
		if errors.Is(err, content.ErrMismatchedDigest) || errors.Is(err, content.ErrTrailingData) {
			return ErrMalformed, fmt.Sprintf("payload blob %s does not match its digest", layer.Digest)
		}
		return ErrMalformed, fmt.Sprintf("payload blob %s: %v", layer.Digest, err)
	}
	if err := key.verifier.VerifySignature(bytes.NewReader(sig), bytes.NewReader(body)); err != nil {
		return ErrOtherKey, "the signature does not verify with the key (signed by another key, or the payload was altered)"
	}
	var p payload.SimpleContainerImage
	if err := json.Unmarshal(body, &p); err != nil {
		return ErrMalformed, fmt.Sprintf("the signed payload is not a cosign simple-signing document: %v", err)
	}
	if got := p.Critical.Image.DockerManifestDigest; got != d.String() {
		return ErrOtherDigest, fmt.Sprintf("the signed payload names %q, the manifest resolved is %s", got, d)
	}
	return "", ""
}

// isNotFound catches a 404 that oras-go reports as a response error rather
// than errdef.ErrNotFound.
func isNotFound(err error) bool {
	var resp *errcode.ErrorResponse
	return errors.As(err, &resp) && resp.StatusCode == http.StatusNotFound
}
