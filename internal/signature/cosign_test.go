package signature_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"

	"github.com/sylva-projects/osimages/internal/devregistry"
	"github.com/sylva-projects/osimages/internal/signature"
	"github.com/sylva-projects/osimages/internal/testenv"
)

// cosignCLI finds the cosign CLI (github.com/sigstore/cosign/v3/cmd/cosign,
// `go install`ed, hack/tools.sh builds it), or ends the test through
// testenv.Missing: it takes long to build, so a developer's run may go
// without it; CI may not. OSIMAGES_COSIGN names the binary; otherwise PATH is
// searched.
func cosignCLI(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("OSIMAGES_COSIGN"); p != "" {
		return p
	}
	p, err := exec.LookPath("cosign")
	if err != nil {
		testenv.Missing(t, "cosign CLI not found (set OSIMAGES_COSIGN or put cosign on PATH, e.g. go install github.com/sigstore/cosign/v3/cmd/cosign@v3.1.3): skipping the cross-check with the real cosign")
	}
	return p
}

// cosignKeyPair makes a key pair with the CLI in a new folder (cosign.key,
// cosign.pub), and returns the folder and the public key as osimages reads it.
func cosignKeyPair(t *testing.T, bin string) (string, *signature.PublicKey) {
	t.Helper()
	dir := t.TempDir()
	if out, err := runCosign(t, bin, dir, "generate-key-pair"); err != nil {
		t.Fatalf("cosign generate-key-pair: %v\n%s", err, out)
	}
	pub, err := os.ReadFile(filepath.Join(dir, "cosign.pub"))
	if err != nil {
		t.Fatal(err)
	}
	key, err := signature.ParsePublicKey(pub)
	if err != nil {
		t.Fatalf("cosign.pub: %v", err)
	}
	return dir, key
}

func runCosign(t *testing.T, bin, dir string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	// No password on the test key; no outside network, no TUF, no tlog.
	cmd.Env = append(os.Environ(), "COSIGN_PASSWORD=", "HOME="+dir, "DOCKER_CONFIG="+dir, "TUF_ROOT="+filepath.Join(dir, "tuf"))
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestCosignCrossCheck checks both directions against the real cosign: a
// signature made by `cosign sign --key` verifies here, and one made by
// devregistry.Sign (the test helper every other test relies on) verifies
// with `cosign verify --key --insecure-ignore-tlog=true`, as Sylva runs it.
func TestCosignCrossCheck(t *testing.T) {
	bin := cosignCLI(t)
	f := newFixture(t)
	ctx := context.Background()
	dir, key := cosignKeyPair(t, bin)

	// cosign signs, osimages verifies.
	uri, d := f.publish(t, "dib/by-cosign", "1.0", 21)
	ref := strings.TrimPrefix(uri[:strings.LastIndex(uri, ":")], "oci://") + "@" + d.String()
	out, err := runCosign(t, bin, dir, "sign", "--key", "cosign.key", "--yes", "--tlog-upload=false",
		"--new-bundle-format=false", "--use-signing-config=false", "--allow-http-registry", ref)
	if err != nil {
		t.Fatalf("cosign sign: %v\n%s", err, out)
	}
	if err := f.verifier.Verify(ctx, uri, d, key); err != nil {
		t.Errorf("a signature made by cosign does not verify: %v", err)
	}
	wantRefused(t, f.verifier.Verify(ctx, uri, d, f.key), signature.ErrOtherKey, uri)

	// osimages' test signer signs, cosign verifies.
	uri, d = f.publish(t, "dib/by-helper", "1.0", 22)
	f.sign(t, f.signer, "dib/by-helper", d, devregistry.SignOptions{})
	ref = strings.TrimPrefix(uri[:strings.LastIndex(uri, ":")], "oci://") + "@" + d.String()
	if err := os.WriteFile(filepath.Join(dir, "helper.pub"), []byte(f.signer.PublicKeyPEM), 0o600); err != nil {
		t.Fatal(err)
	}
	verify := func(keyFile string) (string, error) {
		return runCosign(t, bin, dir, "verify", "--key", keyFile, "--insecure-ignore-tlog=true",
			"--new-bundle-format=false", "--allow-http-registry", ref)
	}
	if out, err := verify("helper.pub"); err != nil {
		t.Errorf("cosign verify refuses the helper's signature: %v\n%s", err, out)
	}
	if out, err := verify("cosign.pub"); err == nil {
		t.Errorf("cosign verify accepts the helper's signature with another key:\n%s", out)
	}
}

// bundleOf returns the Sigstore bundle attached to manifest d of
// repository (the one layer of its one bundle referrer).
func bundleOf(t *testing.T, f fixture, repository string, d digest.Digest) []byte {
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
	var bundles []ocispec.Descriptor
	if err := repo.Referrers(ctx, subject, bundleType, func(rs []ocispec.Descriptor) error {
		bundles = append(bundles, rs...)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(bundles) != 1 {
		t.Fatalf("%s@%s: want one bundle referrer, got %v", repository, d, bundles)
	}
	mb, err := content.FetchAll(ctx, repo, bundles[0])
	if err != nil {
		t.Fatal(err)
	}
	var m ocispec.Manifest
	if err := json.Unmarshal(mb, &m); err != nil || len(m.Layers) != 1 || m.Layers[0].MediaType != bundleType {
		t.Fatalf("bundle referrer %s: %v %s", bundles[0].Digest, err, mb)
	}
	body, err := content.FetchAll(ctx, repo, m.Layers[0])
	if err != nil {
		t.Fatal(err)
	}
	return body
}

// TestCosignBundle checks cosign v3's default format against the real
// cosign: `cosign sign --key` (a Sigstore bundle attached as a referrer)
// verifies here, beside signatures in the legacy format on the same
// registry, and a bundle of another key, of another artifact, or altered
// is refused. The other way, cosign verifies the bundles of the tests'
// signer.
func TestCosignBundle(t *testing.T) {
	bin := cosignCLI(t)
	f := newFixture(t)
	ctx := context.Background()
	dir, key := cosignKeyPair(t, bin)
	const repo = "dib/cosign-v3"
	refOf := func(uri string, d digest.Digest) string {
		return strings.TrimPrefix(uri[:strings.LastIndex(uri, ":")], "oci://") + "@" + d.String()
	}
	// cosign v3's defaults, with no Sigstore service reachable: no signing
	// config (it would name Rekor and a TSA), no upload to the log.
	sign := func(uri string, d digest.Digest, extra ...string) {
		t.Helper()
		args := append([]string{"sign", "--key", "cosign.key", "--yes", "--tlog-upload=false", "--use-signing-config=false", "--allow-http-registry"}, extra...)
		if out, err := runCosign(t, bin, dir, append(args, refOf(uri, d))...); err != nil {
			t.Fatalf("cosign sign %v: %v\n%s", extra, err, out)
		}
	}

	bundled, dBundled := f.publish(t, repo, "bundle", 51)
	sign(bundled, dBundled)
	legacy, dLegacy := f.publish(t, repo, "legacy", 52)
	sign(legacy, dLegacy, "--new-bundle-format=false")
	both, dBoth := f.publish(t, repo, "both", 53)
	sign(both, dBoth, "--new-bundle-format=false")
	sign(both, dBoth)

	bundle := bundleOf(t, f, repo, dBundled)
	if !strings.Contains(string(bundle), `"dsseEnvelope"`) {
		t.Fatalf("cosign wrote no DSSE bundle: %s", bundle)
	}
	for _, c := range []struct {
		uri string
		d   digest.Digest
	}{{bundled, dBundled}, {legacy, dLegacy}, {both, dBoth}} {
		if err := f.verifier.Verify(ctx, c.uri, c.d, key); err != nil {
			t.Errorf("signed by cosign: %v", err)
		}
		wantRefused(t, f.verifier.Verify(ctx, c.uri, c.d, f.key), signature.ErrOtherKey, c.uri, "key "+f.key.Fingerprint())
	}

	// cosign's bundle of one artifact, attached to another.
	moved, dMoved := f.publish(t, repo, "moved", 54)
	pushBundle(t, f, repo, dMoved, bundle, nil)
	wantRefused(t, f.verifier.Verify(ctx, moved, dMoved, key), signature.ErrOtherDigest, moved, dBundled.String(), "the manifest resolved is "+dMoved.String())

	// The same, its statement rewritten to name the other artifact.
	tampered, dTampered := f.publish(t, repo, "tampered", 55)
	pushBundle(t, f, repo, dTampered, tamper(t, bundle, dBundled.Encoded(), dTampered.Encoded()), nil)
	wantRefused(t, f.verifier.Verify(ctx, tampered, dTampered, key), signature.ErrOtherKey, tampered, "(Sigstore bundle)")

	// A bundle holding a message signature, as `cosign sign-blob` writes
	// it, of the manifest's bytes: its message digest is the manifest
	// digest.
	blob, dBlob := f.publish(t, repo, "blob", 56)
	r, err := f.reg.Repository(repo)
	if err != nil {
		t.Fatal(err)
	}
	desc, err := r.Resolve(ctx, dBlob.String())
	if err != nil {
		t.Fatal(err)
	}
	manifest, err := content.FetchAll(ctx, r, desc)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "manifest.json"), manifest, 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := runCosign(t, bin, dir, "sign-blob", "--key", "cosign.key", "--yes", "--tlog-upload=false", "--use-signing-config=false",
		"--bundle", "blob.bundle.json", "manifest.json"); err != nil {
		t.Fatalf("cosign sign-blob: %v\n%s", err, out)
	}
	msgBundle, err := os.ReadFile(filepath.Join(dir, "blob.bundle.json"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(msgBundle), `"messageSignature"`) {
		t.Fatalf("cosign sign-blob wrote no message signature bundle: %s", msgBundle)
	}
	pushBundle(t, f, repo, dBlob, msgBundle, nil)
	if err := f.verifier.Verify(ctx, blob, dBlob, key); err != nil {
		t.Errorf("a message signature bundle of the manifest: %v", err)
	}
	wantRefused(t, f.verifier.Verify(ctx, blob, dBlob, f.key), signature.ErrOtherKey, blob)
	movedBlob, dMovedBlob := f.publish(t, repo, "moved-blob", 57)
	pushBundle(t, f, repo, dMovedBlob, msgBundle, nil)
	wantRefused(t, f.verifier.Verify(ctx, movedBlob, dMovedBlob, key), signature.ErrOtherDigest, movedBlob, dBlob.String())

	// The tests' signer writes bundles that cosign verifies, with or
	// without a transparency log entry (ignored with --insecure-ignore-tlog).
	if err := os.WriteFile(filepath.Join(dir, "helper.pub"), []byte(f.signer.PublicKeyPEM), 0o600); err != nil {
		t.Fatal(err)
	}
	for i, opts := range []devregistry.SignOptions{{Bundle: true}, {Bundle: true, TlogEntry: true}} {
		uri, d := f.publish(t, "dib/helper-bundle", fmt.Sprint(i), uint64(60+i))
		f.sign(t, f.signer, "dib/helper-bundle", d, opts)
		verify := func(keyFile string) (string, error) {
			return runCosign(t, bin, dir, "verify", "--key", keyFile, "--insecure-ignore-tlog=true", "--allow-http-registry", refOf(uri, d))
		}
		if out, err := verify("helper.pub"); err != nil {
			t.Errorf("%+v: cosign verify refuses the helper's bundle: %v\n%s", opts, err, out)
		}
		if out, err := verify("cosign.pub"); err == nil {
			t.Errorf("%+v: cosign verify accepts the helper's bundle with another key:\n%s", opts, out)
		}
	}
}
