package signature_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2"

	"github.com/sylva-projects/osimages/internal/devregistry"
	"github.com/sylva-projects/osimages/internal/signature"
	"github.com/sylva-projects/osimages/internal/testenv"
)

const bundleType = "application/vnd.dev.sigstore.bundle.v0.3+json"

// pushBundle attaches body as a Sigstore bundle referrer of manifest d, as
// cosign v3 does, for the bundles the signer cannot make.
func pushBundle(t *testing.T, f fixture, repository string, d digest.Digest, body []byte, annotations map[string]string) {
	t.Helper()
	ctx := context.Background()
	repo, err := f.reg.Repository(repository)
	if err != nil {
		t.Fatal(err)
	}
	subject, err := repo.Resolve(ctx, d.String())
	if err != nil {
		t.Fatal(err)
	}
	layer := ocispec.Descriptor{MediaType: bundleType, Digest: digest.FromBytes(body), Size: int64(len(body))}
	if err := repo.Push(ctx, layer, bytes.NewReader(body)); err != nil {
		t.Fatal(err)
	}
	if _, err := oras.PackManifest(ctx, repo, oras.PackManifestVersion1_1, bundleType, oras.PackManifestOptions{
		Subject: &subject, Layers: []ocispec.Descriptor{layer}, ManifestAnnotations: annotations,
	}); err != nil {
		t.Fatal(err)
	}
}

// TestVerifyBundle covers cosign v3's default format, the Sigstore bundle,
// written by the tests' signer (TestCosignBundle checks the same against
// the real cosign).
func TestVerifyBundle(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	other := testenv.Signer(t)
	bundled := devregistry.SignOptions{Bundle: true}

	t.Run("valid", func(t *testing.T) {
		uri, d := f.publish(t, "dib/b-valid", "1.0", 31)
		f.sign(t, f.signer, "dib/b-valid", d, bundled)
		if err := f.verifier.Verify(ctx, uri, d, f.key); err != nil {
			t.Fatal(err)
		}
		wantRefused(t, f.verifier.Verify(ctx, uri, d, parseKey(t, other)), signature.ErrOtherKey, uri,
			"(Sigstore bundle)", "does not verify with the key", "key "+parseKey(t, other).Fingerprint())
	})

	t.Run("with a transparency log entry", func(t *testing.T) {
		// As with cosign verify --insecure-ignore-tlog=true, the log is
		// neither needed nor consulted: an entry does not make it refused.
		uri, d := f.publish(t, "dib/b-tlog", "1.0", 32)
		f.sign(t, f.signer, "dib/b-tlog", d, devregistry.SignOptions{Bundle: true, TlogEntry: true})
		if err := f.verifier.Verify(ctx, uri, d, f.key); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("both formats on one artifact", func(t *testing.T) {
		// A registry that moves to cosign v3: the .sig tag from before,
		// and a bundle from a key that came later.
		uri, d := f.publish(t, "dib/b-both", "1.0", 33)
		f.sign(t, other, "dib/b-both", d, devregistry.SignOptions{})
		f.sign(t, f.signer, "dib/b-both", d, bundled)
		for _, k := range []*signature.PublicKey{f.key, parseKey(t, other)} {
			if err := f.verifier.Verify(ctx, uri, d, k); err != nil {
				t.Errorf("key %s: %v", k.Fingerprint(), err)
			}
		}
		// Beside a referrer in the legacy format too.
		uri, d = f.publish(t, "dib/b-both", "2.0", 34)
		f.sign(t, other, "dib/b-both", d, devregistry.SignOptions{Referrer: true})
		f.sign(t, f.signer, "dib/b-both", d, bundled)
		if err := f.verifier.Verify(ctx, uri, d, f.key); err != nil {
			t.Fatal(err)
		}
		if err := f.verifier.Verify(ctx, uri, d, parseKey(t, other)); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("another key", func(t *testing.T) {
		uri, d := f.publish(t, "dib/b-other-key", "1.0", 35)
		f.sign(t, other, "dib/b-other-key", d, bundled)
		wantRefused(t, f.verifier.Verify(ctx, uri, d, f.key), signature.ErrOtherKey, uri, "(Sigstore bundle)", "does not verify with the key")
	})

	t.Run("altered signature", func(t *testing.T) {
		uri, d := f.publish(t, "dib/b-altered", "1.0", 36)
		f.sign(t, f.signer, "dib/b-altered", d, devregistry.SignOptions{Bundle: true, CorruptSignature: true})
		wantRefused(t, f.verifier.Verify(ctx, uri, d, f.key), signature.ErrOtherKey, uri)
	})

	t.Run("payload for another digest", func(t *testing.T) {
		uri, d := f.publish(t, "dib/b-other-digest", "1.0", 37)
		_, otherDigest := f.publish(t, "dib/b-other-digest", "0.9", 38)
		f.sign(t, f.signer, "dib/b-other-digest", d, devregistry.SignOptions{Bundle: true, PayloadDigest: otherDigest})
		wantRefused(t, f.verifier.Verify(ctx, uri, d, f.key), signature.ErrOtherDigest, uri, otherDigest.String(), "the manifest resolved is "+d.String())
	})

	t.Run("tampered statement", func(t *testing.T) {
		// A valid bundle of another artifact, its statement rewritten to
		// name this one: the signature no longer covers it.
		uri, d := f.publish(t, "dib/b-tampered", "1.0", 39)
		_, otherDigest := f.publish(t, "dib/b-tampered", "0.9", 40)
		body, err := f.signer.Bundle(otherDigest, devregistry.SignOptions{})
		if err != nil {
			t.Fatal(err)
		}
		pushBundle(t, f, "dib/b-tampered", d, tamper(t, body, otherDigest.Encoded(), d.Encoded()), nil)
		wantRefused(t, f.verifier.Verify(ctx, uri, d, f.key), signature.ErrOtherKey, uri, "(Sigstore bundle)", "does not verify with the key")
	})

	t.Run("an attestation is not a signature", func(t *testing.T) {
		uri, d := f.publish(t, "dib/b-attest", "1.0", 41)
		sbom := devregistry.SignOptions{Bundle: true, PredicateType: "https://spdx.dev/Document"}
		// Announced as an attestation, as cosign attest does: passed over.
		f.sign(t, f.signer, "dib/b-attest", d, sbom)
		wantRefused(t, f.verifier.Verify(ctx, uri, d, f.key), signature.ErrNoSignature, uri, "Sigstore bundle")
		// Not announced: read, and refused for what it says.
		body, err := f.signer.Bundle(d, sbom)
		if err != nil {
			t.Fatal(err)
		}
		pushBundle(t, f, "dib/b-attest", d, body, nil)
		wantRefused(t, f.verifier.Verify(ctx, uri, d, f.key), signature.ErrMalformed, uri, `predicate type "https://spdx.dev/Document"`)
	})

	t.Run("malformed", func(t *testing.T) {
		uri, d := f.publish(t, "dib/b-malformed", "1.0", 42)
		pushBundle(t, f, "dib/b-malformed", d, []byte(`{"not":"a bundle"}`), nil)
		wantRefused(t, f.verifier.Verify(ctx, uri, d, f.key), signature.ErrMalformed, uri, "not a Sigstore bundle")

		uri, d = f.publish(t, "dib/b-malformed", "2.0", 43)
		pushBundle(t, f, "dib/b-malformed", d, []byte(`{"mediaType":"application/vnd.dev.sigstore.bundle.v0.3+json"}`), nil)
		wantRefused(t, f.verifier.Verify(ctx, uri, d, f.key), signature.ErrMalformed, uri, "no verification material")
	})

	t.Run("altered envelope", func(t *testing.T) {
		uri, d := f.publish(t, "dib/b-envelope", "1.0", 45)
		body, err := f.signer.Bundle(d, devregistry.SignOptions{})
		if err != nil {
			t.Fatal(err)
		}
		i := 0
		for _, c := range []struct {
			name   string
			alter  func(env map[string]any)
			reason signature.Reason
			detail string
		}{
			{"another payload type", func(env map[string]any) { env["payloadType"] = "application/json" }, signature.ErrMalformed, `payload type "application/json"`},
			{"two signatures", func(env map[string]any) {
				sigs := env["signatures"].([]any)
				env["signatures"] = append(sigs, sigs[0])
			}, signature.ErrMalformed, "2 signatures"},
			{"no signature", func(env map[string]any) { env["signatures"] = []any{} }, signature.ErrMalformed, "0 signatures"},
		} {
			i++
			var b map[string]any
			if err := json.Unmarshal(body, &b); err != nil {
				t.Fatal(err)
			}
			c.alter(b["dsseEnvelope"].(map[string]any))
			altered, err := json.Marshal(b)
			if err != nil {
				t.Fatal(err)
			}
			// One artifact per case: every bundle of an artifact is read.
			uri, d := f.publish(t, "dib/b-envelope", fmt.Sprint("case", i), uint64(45+i))
			pushBundle(t, f, "dib/b-envelope", d, altered, nil)
			t.Run(c.name, func(t *testing.T) { wantRefused(t, f.verifier.Verify(ctx, uri, d, f.key), c.reason, uri, c.detail) })
		}
		// Unaltered, it verifies: the cases above fail for what was altered.
		pushBundle(t, f, "dib/b-envelope", d, body, nil)
		if err := f.verifier.Verify(ctx, uri, d, f.key); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("keyless", func(t *testing.T) {
		// A Fulcio certificate instead of a key: not what a cosign_publickey
		// vouches for.
		uri, d := f.publish(t, "dib/b-keyless", "1.0", 44)
		pushBundle(t, f, "dib/b-keyless", d, []byte(`{"mediaType":"application/vnd.dev.sigstore.bundle.v0.3+json",
			"verificationMaterial":{"certificate":{"rawBytes":"AAAA"}},
			"messageSignature":{"messageDigest":{"algorithm":"SHA2_256","digest":"AAAA"},"signature":"AAAA"}}`), nil)
		wantRefused(t, f.verifier.Verify(ctx, uri, d, f.key), signature.ErrOtherKey, uri, "keyless")
	})
}

// tamper replaces from with to in the statement of a bundle's DSSE
// envelope, leaving its signature as it was.
func tamper(t *testing.T, body []byte, from, to string) []byte {
	t.Helper()
	var b map[string]any
	if err := json.Unmarshal(body, &b); err != nil {
		t.Fatal(err)
	}
	env := b["dsseEnvelope"].(map[string]any)
	payload, err := base64.StdEncoding.DecodeString(env["payload"].(string))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(payload), from) {
		t.Fatalf("the statement does not name %s: %s", from, payload)
	}
	env["payload"] = base64.StdEncoding.EncodeToString([]byte(strings.ReplaceAll(string(payload), from, to)))
	out, err := json.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	return out
}
