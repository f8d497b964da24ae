package signature_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2"

	"github.com/sylva-projects/osimages/internal/devregistry"
	"github.com/sylva-projects/osimages/internal/oci"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/signature"
	"github.com/sylva-projects/osimages/internal/testenv"
)

type fixture struct {
	reg      *devregistry.Registry
	verifier signature.Verifier
	signer   *devregistry.Signer
	key      *signature.PublicKey
}

func newFixture(t *testing.T) fixture {
	t.Helper()
	return newFixtureWith(t, nil)
}

// newFixtureWith is newFixture on a registry that serves the referrers API
// (api), or only the referrers tag schema (nil), as distribution does.
func newFixtureWith(t *testing.T, api *devregistry.ReferrersAPI) fixture {
	t.Helper()
	opts := devregistry.Options{}
	if api != nil {
		opts.Middleware = api.Middleware
	}
	reg := testenv.Registry(t, opts)
	client, err := oci.NewClient(oci.Options{Insecure: true})
	if err != nil {
		t.Fatal(err)
	}
	signer := testenv.Signer(t)
	return fixture{reg: reg, verifier: signature.Verifier{Client: client}, signer: signer, key: parseKey(t, signer)}
}

func parseKey(t *testing.T, s *devregistry.Signer) *signature.PublicKey {
	t.Helper()
	k, err := signature.ParsePublicKey([]byte(s.PublicKeyPEM))
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// publish pushes a small artifact and returns its URI and manifest digest.
func (f fixture) publish(t *testing.T, repo, tag string, seed uint64) (string, digest.Digest) {
	t.Helper()
	p, err := f.reg.Publish(context.Background(), devregistry.DiskImage{
		Repository: repo, Tag: tag, Content: devregistry.DiskContent(4<<10, seed),
		Fields: osimage.Image{"os": "ubuntu"},
	})
	if err != nil {
		t.Fatal(err)
	}
	return "oci://" + p.Ref, p.ManifestDigest
}

func (f fixture) sign(t *testing.T, s *devregistry.Signer, repo string, d digest.Digest, opts devregistry.SignOptions) {
	t.Helper()
	if err := f.reg.Sign(context.Background(), s, repo, d, opts); err != nil {
		t.Fatal(err)
	}
}

func wantRefused(t *testing.T, err error, reason signature.Reason, uri string, details ...string) {
	t.Helper()
	if !errors.Is(err, reason) {
		t.Fatalf("want %q, got %v", reason, err)
	}
	var serr *signature.Error
	if !errors.As(err, &serr) {
		t.Fatalf("not a *signature.Error: %T %v", err, err)
	}
	for _, want := range append([]string{"Invalid signature for " + uri + ": " + string(reason)}, details...) {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("message lacks %q: %v", want, err)
		}
	}
}

func TestVerify(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	other := testenv.Signer(t)

	t.Run("valid", func(t *testing.T) {
		uri, d := f.publish(t, "dib/valid", "1.0", 1)
		f.sign(t, f.signer, "dib/valid", d, devregistry.SignOptions{})
		if err := f.verifier.Verify(ctx, uri, d, f.key); err != nil {
			t.Fatal(err)
		}
		// The same signature does not vouch for another key.
		wantRefused(t, f.verifier.Verify(ctx, uri, d, parseKey(t, other)), signature.ErrOtherKey, uri,
			"sha256-"+d.Encoded()+".sig", "key "+parseKey(t, other).Fingerprint())
	})

	t.Run("valid as an OCI referrer", func(t *testing.T) {
		uri, d := f.publish(t, "dib/referrer", "1.0", 2)
		f.sign(t, f.signer, "dib/referrer", d, devregistry.SignOptions{Referrer: true})
		if err := f.verifier.Verify(ctx, uri, d, f.key); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("one valid signature among others", func(t *testing.T) {
		uri, d := f.publish(t, "dib/several", "1.0", 3)
		// The .sig tag holds another key's signature; a referrer holds ours.
		f.sign(t, other, "dib/several", d, devregistry.SignOptions{})
		f.sign(t, f.signer, "dib/several", d, devregistry.SignOptions{Referrer: true})
		if err := f.verifier.Verify(ctx, uri, d, f.key); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("another key", func(t *testing.T) {
		uri, d := f.publish(t, "dib/other-key", "1.0", 4)
		f.sign(t, other, "dib/other-key", d, devregistry.SignOptions{})
		wantRefused(t, f.verifier.Verify(ctx, uri, d, f.key), signature.ErrOtherKey, uri, "does not verify with the key")
	})

	t.Run("altered signature", func(t *testing.T) {
		uri, d := f.publish(t, "dib/altered", "1.0", 5)
		f.sign(t, f.signer, "dib/altered", d, devregistry.SignOptions{CorruptSignature: true})
		wantRefused(t, f.verifier.Verify(ctx, uri, d, f.key), signature.ErrOtherKey, uri)
	})

	t.Run("payload for another digest", func(t *testing.T) {
		uri, d := f.publish(t, "dib/other-digest", "1.0", 6)
		_, otherDigest := f.publish(t, "dib/other-digest", "0.9", 7)
		// A valid signature of another artifact, placed under this one's tag.
		f.sign(t, f.signer, "dib/other-digest", d, devregistry.SignOptions{PayloadDigest: otherDigest})
		wantRefused(t, f.verifier.Verify(ctx, uri, d, f.key), signature.ErrOtherDigest, uri, otherDigest.String())
	})

	t.Run("no signature", func(t *testing.T) {
		uri, d := f.publish(t, "dib/unsigned", "1.0", 8)
		wantRefused(t, f.verifier.Verify(ctx, uri, d, f.key), signature.ErrNoSignature, uri, "sha256-"+d.Encoded()+".sig", "cosign sign --key")
	})

	t.Run("an empty Sigstore bundle referrer", func(t *testing.T) {
		uri, d := f.publish(t, "dib/bundle", "1.0", 12)
		repo, err := f.reg.Repository("dib/bundle")
		if err != nil {
			t.Fatal(err)
		}
		subject, err := repo.Resolve(ctx, d.String())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := oras.PackManifest(ctx, repo, oras.PackManifestVersion1_1, "application/vnd.dev.sigstore.bundle.v0.3+json",
			oras.PackManifestOptions{Subject: &subject}); err != nil {
			t.Fatal(err)
		}
		wantRefused(t, f.verifier.Verify(ctx, uri, d, f.key), signature.ErrMalformed, uri, "(Sigstore bundle)", "holds no application/vnd.dev.sigstore.bundle* layer")
	})

	t.Run("signature of the tag's previous manifest", func(t *testing.T) {
		// The tag moved: the old manifest is signed, the new one is not.
		_, old := f.publish(t, "dib/moved", "1.0", 9)
		f.sign(t, f.signer, "dib/moved", old, devregistry.SignOptions{})
		uri, d := f.publish(t, "dib/moved", "1.0", 10)
		if err := f.verifier.Verify(ctx, uri, old, f.key); err != nil {
			t.Errorf("the old manifest: %v", err)
		}
		wantRefused(t, f.verifier.Verify(ctx, uri, d, f.key), signature.ErrNoSignature, uri)
	})

	t.Run("malformed", func(t *testing.T) {
		uri, d := f.publish(t, "dib/malformed", "1.0", 11)
		pushSigManifest(t, f.reg, "dib/malformed", d, []byte(`{"not":"a signature"}`), map[string]string{})
		wantRefused(t, f.verifier.Verify(ctx, uri, d, f.key), signature.ErrMalformed, uri, "no dev.cosignproject.cosign/signature annotation")

		pushSigManifest(t, f.reg, "dib/malformed", d, []byte(`{}`), map[string]string{signature.SignatureAnnotation: "***"})
		wantRefused(t, f.verifier.Verify(ctx, uri, d, f.key), signature.ErrMalformed, uri, "not base64")
	})

	t.Run("the registry is down", func(t *testing.T) {
		reg := testenv.Registry(t, devregistry.Options{})
		host := reg.Host
		reg.Close()
		err := f.verifier.Verify(ctx, "oci://"+host+"/dib/x:1.0", digest.FromString("x"), f.key)
		var serr *signature.Error
		if err == nil || errors.As(err, &serr) {
			t.Fatalf("an unreachable registry is not a verdict on the signature: %v", err)
		}
	})
}

// pushSigManifest pushes a hand-made signature manifest with one
// simple-signing layer, for the malformed cases the signer cannot make.
func pushSigManifest(t *testing.T, reg *devregistry.Registry, repository string, d digest.Digest, body []byte, annotations map[string]string) {
	t.Helper()
	ctx := context.Background()
	repo, err := reg.Repository(repository)
	if err != nil {
		t.Fatal(err)
	}
	layer := ocispec.Descriptor{MediaType: signature.SimpleSigningMediaType, Digest: digest.FromBytes(body), Size: int64(len(body)), Annotations: annotations}
	if err := repo.Push(ctx, layer, bytes.NewReader(body)); err != nil {
		t.Fatal(err)
	}
	m, err := oras.PackManifest(ctx, repo, oras.PackManifestVersion1_1, "application/vnd.test", oras.PackManifestOptions{Layers: []ocispec.Descriptor{layer}})
	if err != nil {
		t.Fatal(err)
	}
	if err := repo.Tag(ctx, m, "sha256-"+d.Encoded()+".sig"); err != nil {
		t.Fatal(err)
	}
}

func TestParsePublicKey(t *testing.T) {
	for _, bad := range []string{"", "not a key", "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n"} {
		if _, err := signature.ParsePublicKey([]byte(bad)); err == nil {
			t.Errorf("%q: accepted", bad)
		}
	}
	s := testenv.Signer(t)
	k1, k2 := parseKey(t, s), parseKey(t, testenv.Signer(t))
	if k1.Fingerprint() == k2.Fingerprint() || len(k1.Fingerprint()) != 16 {
		t.Errorf("fingerprints %q %q", k1.Fingerprint(), k2.Fingerprint())
	}
	// Indented as YAML block scalars often leave it, with surrounding space.
	if _, err := signature.ParsePublicKey([]byte("\n  " + s.PublicKeyPEM + "\n")); err != nil {
		t.Errorf("surrounding space: %v", err)
	}
}
