package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sylva-projects/osimages/internal/devregistry"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/testenv"
)

// registryWithKey is the os_images_oci_registries block of one registry
// "sylva" at url, with tag and cosign_publickey.
func registryWithKey(url, tag, pemKey string) string {
	return fmt.Sprintf("os_images_oci_registries:\n  sylva:\n    url: %s\n    tag: %q\n    cosign_publickey: |\n      %s\n",
		url, tag, strings.ReplaceAll(strings.TrimSpace(pemKey), "\n", "\n      "))
}

func TestCatalogSignatures(t *testing.T) {
	names := []string{"ubuntu-signed", "ubuntu-other-key", "ubuntu-other-digest", "ubuntu-unsigned",
		"ubuntu-bundle", "ubuntu-bundle-other-key", "ubuntu-bundle-other-digest", "ubuntu-both"}
	reg, _, published := countingRegistry(t, []string{"0.7.6"}, names...)
	ours, theirs := testenv.Signer(t), testenv.Signer(t)
	testenv.Sign(t, reg, ours, published["ubuntu-signed:0.7.6"], devregistry.SignOptions{})
	testenv.Sign(t, reg, theirs, published["ubuntu-other-key:0.7.6"], devregistry.SignOptions{})
	testenv.Sign(t, reg, ours, published["ubuntu-other-digest:0.7.6"], devregistry.SignOptions{PayloadDigest: published["ubuntu-signed:0.7.6"].ManifestDigest})
	// cosign v3's default format, the Sigstore bundle, on the same registry.
	testenv.Sign(t, reg, ours, published["ubuntu-bundle:0.7.6"], devregistry.SignOptions{Bundle: true})
	testenv.Sign(t, reg, theirs, published["ubuntu-bundle-other-key:0.7.6"], devregistry.SignOptions{Bundle: true})
	testenv.Sign(t, reg, ours, published["ubuntu-bundle-other-digest:0.7.6"], devregistry.SignOptions{Bundle: true, PayloadDigest: published["ubuntu-bundle:0.7.6"].ManifestDigest})
	// Another key's .sig tag does not hide a bundle made with ours.
	testenv.Sign(t, reg, theirs, published["ubuntu-both:0.7.6"], devregistry.SignOptions{})
	testenv.Sign(t, reg, ours, published["ubuntu-both:0.7.6"], devregistry.SignOptions{Bundle: true})

	valuesFor := func(key string, extra string, names ...string) string {
		var b strings.Builder
		b.WriteString("oci_registry_insecure: true\n")
		b.WriteString(registryWithKey("oci://"+reg.Host+"/"+strings.TrimSuffix(dibRepo, "/"), "0.7.6", key))
		b.WriteString("sylva_diskimagebuilder_images:\n")
		for _, n := range names {
			fmt.Fprintf(&b, "  %s: {os_images_oci_registry: sylva}\n", n)
		}
		b.WriteString(extra)
		return writeFile(t, "values.yaml", b.String())
	}
	uri := func(name string) string { return "oci://" + published[name+":0.7.6"].Ref }

	r := run(t, "catalog", "-f", valuesFor(ours.PublicKeyPEM, "", names...))
	if r.code != 1 || r.stdout != "" {
		t.Fatalf("want exit 1 and no output, got %d, %q\n%s", r.code, r.stdout, r.stderr)
	}
	for _, want := range []string{
		"5 of 8 images could not be resolved",
		"ubuntu-bundle-other-key (" + uri("ubuntu-bundle-other-key") + "): Invalid signature for " + uri("ubuntu-bundle-other-key") + ": signed by another key",
		"ubuntu-bundle-other-digest (" + uri("ubuntu-bundle-other-digest") + "): Invalid signature for " + uri("ubuntu-bundle-other-digest") + ": the signed payload names another manifest digest",
		"ubuntu-other-key (" + uri("ubuntu-other-key") + "): Invalid signature for " + uri("ubuntu-other-key") + ": signed by another key",
		"ubuntu-other-digest (" + uri("ubuntu-other-digest") + "): Invalid signature for " + uri("ubuntu-other-digest") + ": the signed payload names another manifest digest",
		"ubuntu-unsigned (" + uri("ubuntu-unsigned") + "): Invalid signature for " + uri("ubuntu-unsigned") + ": no signature found",
		"os_images_oci_registries.sylva.cosign_publickey",
	} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, r.stderr)
		}
	}
	signed := []string{"ubuntu-signed", "ubuntu-bundle", "ubuntu-both"}
	for _, n := range signed {
		if strings.Contains(r.stderr, n+" (") {
			t.Errorf("the signed image %s is reported:\n%s", n, r.stderr)
		}
	}

	r = run(t, "catalog", "-f", valuesFor(ours.PublicKeyPEM, "", signed...))
	if r.code != 0 {
		t.Fatalf("signed images: exit %d: %s", r.code, r.stderr)
	}
	_, cat := parseConfigMap(t, r.stdout)
	for _, n := range signed {
		if got, want := cat[n][osimage.FieldManifestDigest], published[n+":0.7.6"].ManifestDigest.String(); got != want {
			t.Errorf("%s: oci-manifest-digest = %q, want %q", n, got, want)
		}
	}

	r = run(t, "catalog", "-f", valuesFor(ours.PublicKeyPEM, "security:\n  os_images:\n    skip_signing_check: true\n", names...))
	if r.code != 0 {
		t.Fatalf("skip_signing_check: exit %d: %s", r.code, r.stderr)
	}
	if _, cat := parseConfigMap(t, r.stdout); len(cat) != len(names) {
		t.Errorf("skip_signing_check published %d images, want %d", len(cat), len(names))
	}
	if !strings.Contains(r.stderr, "security.os_images.skip_signing_check is true: cosign signatures are NOT checked (registries with a cosign_publickey: sylva)") {
		t.Errorf("the skipped check is not logged:\n%s", r.stderr)
	}

	r = run(t, "catalog", "-f", valuesFor("-----BEGIN PUBLIC KEY-----\nnot base64\n-----END PUBLIC KEY-----", "", names...))
	if r.code != 2 || !strings.Contains(r.stderr, "os_images_oci_registries.sylva.cosign_publickey: not a PEM public key") {
		t.Errorf("bad key: exit %d, %s", r.code, r.stderr)
	}
}

// TestSignedCatalogThenServe runs the chain as an operator does: the
// catalog verifies and pins two signed images, then one tag is moved (to
// validly signed content) before the server pulls it. The server refuses it
// and serves the other.
func TestSignedCatalogThenServe(t *testing.T) {
	reg := testenv.Registry(t, devregistry.Options{})
	published := publishServeImages(t, reg, 1<<20)
	plain, hardened := published["ubuntu-plain"], published["ubuntu-hardened"]
	ours := testenv.Signer(t)
	testenv.Sign(t, reg, ours, plain, devregistry.SignOptions{})
	testenv.Sign(t, reg, ours, hardened, devregistry.SignOptions{Bundle: true}) // cosign v3's default format

	registries := registryWithKey("oci://"+reg.Host+"/dib", "1.0", ours.PublicKeyPEM)
	values := writeFile(t, "values.yaml", "oci_registry_insecure: true\n"+registries+
		"sylva_diskimagebuilder_images:\n  ubuntu-plain: {os_images_oci_registry: sylva}\n  ubuntu-hardened: {os_images_oci_registry: sylva}\n")
	r := run(t, "catalog", "-f", values)
	if r.code != 0 {
		t.Fatalf("catalog: exit %d: %s", r.code, r.stderr)
	}
	osImages := writeFile(t, "os-images-info.yaml", r.stdout)

	// The tag moves after the catalog ran, to other content, signed.
	moved, err := reg.Publish(context.Background(), devregistry.DiskImage{
		Repository: "dib/ubuntu-plain", Tag: "1.0", Gzip: true, Content: devregistry.DiskContent(1<<20, 99),
		Fields: osimage.Image{"os": "ubuntu", "hardened": "false", "k8s-flavor": "rke2", "k8s-version": "1.32.5+rke2r1"},
	})
	if err != nil {
		t.Fatal(err)
	}
	testenv.Sign(t, reg, ours, moved, devregistry.SignOptions{})

	mgmt := writeFile(t, "mgmt.yaml", mgmtServeValues+"oci_registry_insecure: true\n"+registries+
		"os_image_server_additional_selectors:\n  hardened: {hardened: true}\n")
	output := filepath.Join(t.TempDir(), "served.yaml")
	d := startServe(t, freeAddr(t), "--data", t.TempDir(), "--os-images", osImages, "-f", mgmt, "--output-file", output)
	served := servedFile(output)
	testenv.Eventually(t, "hardened served, plain refused", 30*time.Second, func() (bool, string) {
		s := served()
		e, ok := s[imageSHA(t, plain)]
		return allAvailable(s, imageSHA(t, hardened)) && ok && !e.Available && strings.Contains(d.stderr.String(), "download failed"), fmt.Sprint(s, d.stderr.String())
	})
	get := func(path string) string {
		resp, err := http.Get(d.url(path))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return string(body)
	}
	want := "manifest digest mismatch: expected " + plain.ManifestDigest.String() + ", got " + moved.ManifestDigest.String()
	if page := get("/"); !strings.Contains(page, want) {
		t.Errorf("status page lacks %q", want)
	}
	if !strings.Contains(d.stderr.String(), want) {
		t.Errorf("log lacks %q:\n%s", want, d.stderr.String())
	}
	if metrics := get("/metrics"); !strings.Contains(metrics, "osimages_verification_failures_total 1") {
		t.Errorf("metrics: %s", metrics)
	}
	if !strings.Contains(d.stderr.String(), "cosign signatures are checked before the download of images under these registries") {
		t.Errorf("log does not say signatures are checked:\n%s", d.stderr.String())
	}
}
