package devregistry

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"time"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/sigstore/sigstore/pkg/cryptoutils"
	"oras.land/oras-go/v2"
	"oras.land/oras-go/v2/registry/remote"
)

// The Sigstore bundle format as cosign v3.1.3 writes it for `cosign sign
// --key` (checked against the real CLI in internal/signature's tests): a
// DSSE envelope of an in-toto statement naming the manifest, in a v0.3
// bundle, pushed as a referrer. It is written by hand here, not with
// sigstore-go, so that the verifier's parsing is checked against an
// independent writer.
const (
	bundleMediaType     = "application/vnd.dev.sigstore.bundle.v0.3+json"
	cosignSignPredicate = "https://sigstore.dev/cosign/sign/v1"
	inTotoPayloadType   = "application/vnd.in-toto+json"
)

type inTotoStatement struct {
	Type          string          `json:"_type"`
	Subject       []inTotoSubject `json:"subject"`
	PredicateType string          `json:"predicateType"`
	Predicate     struct{}        `json:"predicate"`
}

type inTotoSubject struct {
	Digest      map[string]string `json:"digest"`
	Annotations struct{}          `json:"annotations"`
}

// dssePAE is DSSE's pre-authentication encoding, what is signed.
func dssePAE(payloadType string, payload []byte) []byte {
	return fmt.Appendf(nil, "DSSEv1 %d %s %d %s", len(payloadType), payloadType, len(payload), payload)
}

// Bundle returns the Sigstore bundle (JSON) signing manifest digest named
// with s, as cosign v3 writes it.
func (s *Signer) Bundle(named digest.Digest, opts SignOptions) ([]byte, error) {
	predicateType := cosignSignPredicate
	if opts.PredicateType != "" {
		predicateType = opts.PredicateType
	}
	statement, err := json.Marshal(inTotoStatement{
		Type:          "https://in-toto.io/Statement/v1",
		Subject:       []inTotoSubject{{Digest: map[string]string{named.Algorithm().String(): named.Encoded()}}},
		PredicateType: predicateType,
	})
	if err != nil {
		return nil, err
	}
	sig, err := s.signer.SignMessage(bytes.NewReader(dssePAE(inTotoPayloadType, statement)))
	if err != nil {
		return nil, err
	}
	if opts.CorruptSignature {
		sig[len(sig)/2] ^= 0x01
	}
	pub, err := s.signer.PublicKey()
	if err != nil {
		return nil, err
	}
	der, err := cryptoutils.MarshalPublicKeyToDER(pub)
	if err != nil {
		return nil, err
	}
	hint := sha256.Sum256(der)
	b := map[string]any{
		"mediaType": bundleMediaType,
		"verificationMaterial": map[string]any{
			"publicKey": map[string]any{"hint": hint[:]},
		},
		"dsseEnvelope": map[string]any{
			"payload":     statement,
			"payloadType": inTotoPayloadType,
			"signatures":  []map[string]any{{"sig": sig}},
		},
	}
	if opts.TlogEntry {
		b["verificationMaterial"].(map[string]any)["tlogEntries"] = []any{madeUpTlogEntry(dssePAE(inTotoPayloadType, statement), sig, []byte(s.PublicKeyPEM))}
	}
	// []byte fields marshal as base64, as protojson writes bytes.
	return json.Marshal(b)
}

// madeUpTlogEntry is a Rekor v1 hashedrekord entry of the right shape (its
// signature over the hash of the signed bytes, which parsing the entry
// checks), with an inclusion promise and proof that no log ever signed.
func madeUpTlogEntry(signed, sig, pubPEM []byte) map[string]any {
	sum := sha256.Sum256(signed)
	body, _ := json.Marshal(map[string]any{
		"apiVersion": "0.0.1",
		"kind":       "hashedrekord",
		"spec": map[string]any{
			"data":      map[string]any{"hash": map[string]any{"algorithm": "sha256", "value": fmt.Sprintf("%x", sum)}},
			"signature": map[string]any{"content": sig, "publicKey": map[string]any{"content": pubPEM}},
		},
	})
	root := sha256.Sum256(body)
	return map[string]any{
		"logIndex":          "42",
		"logId":             map[string]any{"keyId": root[:]},
		"kindVersion":       map[string]any{"kind": "hashedrekord", "version": "0.0.1"},
		"integratedTime":    fmt.Sprint(time.Now().Unix()),
		"inclusionPromise":  map[string]any{"signedEntryTimestamp": sig},
		"canonicalizedBody": body,
		"inclusionProof": map[string]any{
			"logIndex":   "42",
			"rootHash":   root[:],
			"treeSize":   "43",
			"hashes":     [][]byte{root[:]},
			"checkpoint": map[string]any{"envelope": "rekor.example - 1\n43\n" + fmt.Sprintf("%x", root) + "\n\n— rekor.example made-up\n"},
		},
	}
}

func predicateAnnotation(opts SignOptions) string {
	if opts.PredicateType != "" {
		return opts.PredicateType
	}
	return cosignSignPredicate
}

// signBundle pushes the bundle as cosign v3 does: a referrer of artifact
// type bundleMediaType, with an empty config, the bundle as its one layer,
// and cosign's annotations.
func (r *Registry) signBundle(ctx context.Context, s *Signer, repo *remote.Repository, repository string, d, named digest.Digest, opts SignOptions) error {
	body, err := s.Bundle(named, opts)
	if err != nil {
		return err
	}
	layer := ocispec.Descriptor{MediaType: bundleMediaType, Digest: digest.FromBytes(body), Size: int64(len(body))}
	if err := repo.Push(ctx, layer, bytes.NewReader(body)); err != nil {
		return fmt.Errorf("pushing the signature bundle of %s: %w", repository, err)
	}
	subject, err := resolveSubject(ctx, repo, d)
	if err != nil {
		return err
	}
	_, err = oras.PackManifest(ctx, repo, oras.PackManifestVersion1_1, bundleMediaType, oras.PackManifestOptions{
		Subject: &subject,
		Layers:  []ocispec.Descriptor{layer},
		ManifestAnnotations: map[string]string{
			"dev.sigstore.bundle.content":       "dsse-envelope",
			"dev.sigstore.bundle.predicateType": predicateAnnotation(opts),
			ocispec.AnnotationCreated:           time.Now().UTC().Format(time.RFC3339),
		},
	})
	if err != nil {
		return fmt.Errorf("pushing the signature bundle referrer of %s: %w", repository, err)
	}
	return nil
}
