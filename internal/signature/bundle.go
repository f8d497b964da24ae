package signature

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/secure-systems-lab/go-securesystemslib/dsse"
	protobundle "github.com/sigstore/protobuf-specs/gen/pb-go/bundle/v1"
	protocommon "github.com/sigstore/protobuf-specs/gen/pb-go/common/v1"
	protodsse "github.com/sigstore/protobuf-specs/gen/pb-go/dsse"
	sigsig "github.com/sigstore/sigstore/pkg/signature"
	sigopts "github.com/sigstore/sigstore/pkg/signature/options"
	"google.golang.org/protobuf/encoding/protojson"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/registry"

	"github.com/sylva-projects/osimages/internal/oci"
)

// The Sigstore bundle format, as cosign v3 attaches it by default
// (--new-bundle-format): a referrer manifest of artifact type
// application/vnd.dev.sigstore.bundle.v0.3+json whose one layer, of the
// same media type, is the bundle JSON. For an image, the bundle holds a
// DSSE envelope of an in-toto statement whose subject is the image
// manifest digest and whose predicate type is CosignSignPredicateType.
const (
	// BundleMediaTypePrefix starts the artifact type of a bundle referrer
	// and the media type of its layer (v0.1 to v0.3 so far).
	BundleMediaTypePrefix = "application/vnd.dev.sigstore.bundle"
	// CosignSignPredicateType is the predicate type of the statement
	// `cosign sign` signs; `cosign attest` signs others (SBOM, provenance),
	// which vouch for something else than the image and are not signatures.
	CosignSignPredicateType = "https://sigstore.dev/cosign/sign/v1"
	// InTotoPayloadType is the DSSE payload type of an in-toto statement.
	InTotoPayloadType = "application/vnd.in-toto+json"
	// bundlePredicateAnnotation is the annotation of a bundle referrer that
	// names the predicate type of its statement.
	bundlePredicateAnnotation = "dev.sigstore.bundle.predicateType"
)

// isSignatureBundle says whether a referrer may be a cosign signature in
// bundle format: a bundle that is not announced as an attestation. The
// predicate type is checked again in the signed statement.
func isSignatureBundle(desc ocispec.Descriptor) bool {
	if !strings.HasPrefix(desc.ArtifactType, BundleMediaTypePrefix) {
		return false
	}
	pt, ok := desc.Annotations[bundlePredicateAnnotation]
	return !ok || pt == CosignSignPredicateType
}

// checkBundleManifest checks every bundle layer of m, as checkManifest
// does the simple-signing ones.
func (v Verifier) checkBundleManifest(ctx context.Context, ref registry.Reference, m oci.Manifest, d digest.Digest, key *PublicKey) ([]verdict, bool) {
	var out []verdict
	for i, layer := range m.Layers {
		if i >= maxLayers {
			break
		}
		if !strings.HasPrefix(layer.MediaType, BundleMediaTypePrefix) {
			continue
		}
		reason, detail := v.checkBundleLayer(ctx, ref, layer, d, key)
		if reason == "" {
			return nil, true
		}
		out = append(out, verdict{where: fmt.Sprintf(", layer %d", i), reason: reason, detail: detail})
	}
	return out, false
}

func (v Verifier) checkBundleLayer(ctx context.Context, ref registry.Reference, layer ocispec.Descriptor, d digest.Digest, key *PublicKey) (Reason, string) {
	body, err := v.Client.ReadBlob(ctx, ref, layer, maxPayloadBytes)
	if err != nil {
		if errors.Is(err, content.ErrMismatchedDigest) || errors.Is(err, content.ErrTrailingData) {
			return ErrMalformed, fmt.Sprintf("bundle blob %s does not match its digest", layer.Digest)
		}
		return ErrMalformed, fmt.Sprintf("bundle blob %s: %v", layer.Digest, err)
	}
	return checkBundle(body, d, key)
}

// checkBundle verifies one Sigstore bundle (JSON) with key, for manifest d.
// The signature is verified before anything the bundle says is believed.
func checkBundle(body []byte, d digest.Digest, key *PublicKey) (Reason, string) {
	var b protobundle.Bundle
	if err := protojson.Unmarshal(body, &b); err != nil {
		return ErrMalformed, fmt.Sprintf("not a Sigstore bundle: %v", err)
	}
	if !strings.HasPrefix(b.GetMediaType(), BundleMediaTypePrefix) {
		return ErrMalformed, fmt.Sprintf("not a Sigstore bundle: media type %q", b.GetMediaType())
	}
	vm := b.GetVerificationMaterial()
	switch {
	case vm.GetPublicKey() != nil:
		// Key-based. The key hint names the key the signer used; it is
		// not trusted, the signature is.
	case vm.GetCertificate() != nil || vm.GetX509CertificateChain() != nil:
		return ErrOtherKey, "the bundle is signed with a certificate (keyless cosign), not with a key; osimages verifies key-based signatures"
	default:
		return ErrMalformed, "the bundle has no verification material"
	}
	// Transparency log entries and timestamps (vm.TlogEntries,
	// vm.TimestampVerificationData) are neither required nor checked, as
	// with cosign verify --insecure-ignore-tlog=true.
	switch {
	case b.GetDsseEnvelope() != nil:
		return checkEnvelope(b.GetDsseEnvelope(), d, key)
	case b.GetMessageSignature() != nil:
		return checkMessageSignature(b.GetMessageSignature(), d, key)
	}
	return ErrMalformed, "the bundle holds neither a DSSE envelope nor a message signature"
}

// inTotoStatement is what osimages reads of an in-toto statement
// (https://github.com/in-toto/attestation, spec v1).
type inTotoStatement struct {
	Type    string `json:"_type"`
	Subject []struct {
		Digest map[string]string `json:"digest"`
	} `json:"subject"`
	PredicateType string `json:"predicateType"`
}

// checkEnvelope checks the DSSE envelope of a bundle: one signature, by
// key, over DSSE's pre-authentication encoding of an in-toto statement of
// cosign's sign predicate whose subject is d.
func checkEnvelope(env *protodsse.Envelope, d digest.Digest, key *PublicKey) (Reason, string) {
	if env.GetPayloadType() != InTotoPayloadType {
		return ErrMalformed, fmt.Sprintf("the bundle's DSSE envelope has payload type %q, not an in-toto statement (%s)", env.GetPayloadType(), InTotoPayloadType)
	}
	if n := len(env.GetSignatures()); n != 1 {
		return ErrMalformed, fmt.Sprintf("the bundle's DSSE envelope has %d signatures; cosign writes exactly one", n)
	}
	signed := dsse.PAE(env.GetPayloadType(), env.GetPayload())
	if err := key.verifier.VerifySignature(bytes.NewReader(env.GetSignatures()[0].GetSig()), bytes.NewReader(signed)); err != nil {
		return ErrOtherKey, "the bundle's signature does not verify with the key (signed by another key, or the bundle was altered)"
	}
	var st inTotoStatement
	if err := json.Unmarshal(env.GetPayload(), &st); err != nil || !strings.HasPrefix(st.Type, "https://in-toto.io/Statement/") {
		return ErrMalformed, fmt.Sprintf("the bundle's DSSE envelope holds no in-toto statement (type %q, %v)", st.Type, err)
	}
	if st.PredicateType != CosignSignPredicateType {
		return ErrMalformed, fmt.Sprintf("the bundle's statement has predicate type %q, an attestation rather than a cosign signature (%s)", st.PredicateType, CosignSignPredicateType)
	}
	var named []string
	for _, s := range st.Subject {
		for alg, hex := range s.Digest {
			if alg == d.Algorithm().String() && strings.EqualFold(hex, d.Encoded()) {
				return "", ""
			}
			named = append(named, alg+":"+hex)
		}
	}
	slices.Sort(named)
	return ErrOtherDigest, fmt.Sprintf("the signed bundle names %q, the manifest resolved is %s", strings.Join(named, ", "), d)
}

// checkMessageSignature checks a bundle that signs a digest directly
// (cosign sign-blob of the manifest): its SHA-256 message digest, signed
// by key, must be d.
func checkMessageSignature(ms *protocommon.MessageSignature, d digest.Digest, key *PublicKey) (Reason, string) {
	md := ms.GetMessageDigest()
	if md.GetAlgorithm() != protocommon.HashAlgorithm_SHA2_256 || len(md.GetDigest()) != sha256.Size {
		return ErrMalformed, fmt.Sprintf("the bundle's message digest is not a SHA-256 digest (%s, %d bytes)", md.GetAlgorithm(), len(md.GetDigest()))
	}
	if _, ok := key.verifier.(*sigsig.ED25519Verifier); ok {
		// Ed25519 signs the message itself, which the bundle does not hold.
		return ErrMalformed, "a message signature cannot be verified by its digest with an Ed25519 key"
	}
	if err := key.verifier.VerifySignature(bytes.NewReader(ms.GetSignature()), bytes.NewReader(nil), sigopts.WithDigest(md.GetDigest())); err != nil {
		return ErrOtherKey, "the bundle's signature does not verify with the key (signed by another key, or the bundle was altered)"
	}
	if got := digest.NewDigestFromBytes(digest.SHA256, md.GetDigest()); got != d {
		return ErrOtherDigest, fmt.Sprintf("the signed bundle names %q, the manifest resolved is %s", got, d)
	}
	return "", ""
}
