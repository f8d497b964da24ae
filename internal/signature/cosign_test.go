package signature_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sylva-projects/osimages/internal/devregistry"
	"github.com/sylva-projects/osimages/internal/signature"
)

// cosignCLI finds the cosign CLI (github.com/sigstore/cosign/v3/cmd/cosign,
// `go install`ed), or skips: it takes long to build, so the test suite does
// not require it. OSIMAGES_COSIGN names the binary; otherwise PATH is
// searched.
func cosignCLI(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("OSIMAGES_COSIGN"); p != "" {
		return p
	}
	p, err := exec.LookPath("cosign")
	if err != nil {
		t.Skip("cosign CLI not found (set OSIMAGES_COSIGN or put cosign on PATH, e.g. go install github.com/sigstore/cosign/v3/cmd/cosign@v3.1.3): skipping the cross-check with the real cosign")
	}
	return p
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
