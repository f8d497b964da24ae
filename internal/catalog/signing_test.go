package catalog

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/opencontainers/go-digest"

	"github.com/sylva-projects/osimages/internal/devregistry"
	"github.com/sylva-projects/osimages/internal/oci"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/testenv"
	"github.com/sylva-projects/osimages/internal/values"
)

// signedValues is dibValues with the sylva registry's cosign key, an
// unsigned registry "plain" on the same host, and extra YAML appended.
func signedValues(t *testing.T, reg *devregistry.Registry, key string, extra string, names ...string) values.Values {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "sylva_base_oci_registry: oci://%s/sylva-projects\noci_registry_insecure: true\n", reg.Host)
	b.WriteString("os_images_oci_registries:\n")
	b.WriteString("  sylva:\n    url: '{{ .Values.sylva_base_oci_registry }}/sylva-elements/diskimage-builder'\n    tag: 0.7.6\n")
	fmt.Fprintf(&b, "    cosign_publickey: |\n      %s\n", strings.ReplaceAll(strings.TrimSpace(key), "\n", "\n      "))
	fmt.Fprintf(&b, "  plain:\n    url: oci://%s/plain\n    tag: 0.7.6\n", reg.Host)
	b.WriteString("sylva_diskimagebuilder_images:\n")
	for _, n := range names {
		fmt.Fprintf(&b, "  %s: {os_images_oci_registry: sylva}\n", n)
	}
	b.WriteString(extra)
	return mustParse(t, b.String())
}

func failuresByKey(t *testing.T, err error) map[string]Failure {
	t.Helper()
	var report *ResolveError
	if !errors.As(err, &report) {
		t.Fatalf("want a ResolveError, got %v", err)
	}
	out := map[string]Failure{}
	for _, f := range report.Failures {
		out[f.Key] = f
	}
	return out
}

func TestResolveVerifiesSignatures(t *testing.T) {
	reg := testenv.Registry(t, devregistry.Options{})
	published := publish(t, reg, 6)
	ours, theirs := testenv.Signer(t), testenv.Signer(t)
	testenv.Sign(t, reg, ours, published["img-00"], devregistry.SignOptions{})
	testenv.Sign(t, reg, ours, published["img-01"], devregistry.SignOptions{Referrer: true})
	testenv.Sign(t, reg, theirs, published["img-02"], devregistry.SignOptions{})
	testenv.Sign(t, reg, ours, published["img-03"], devregistry.SignOptions{PayloadDigest: published["img-00"].ManifestDigest})
	// img-04: not signed. img-05: signed, and used below for the prefix rule.
	testenv.Sign(t, reg, ours, published["img-05"], devregistry.SignOptions{})
	plain, err := reg.Publish(context.Background(), devregistry.DiskImage{Repository: "plain/img-plain", Tag: "0.7.6", Content: []byte("unsigned, from a registry without a key")})
	if err != nil {
		t.Fatal(err)
	}

	unsignedUnderSylva := "oci://" + published["img-04"].Ref
	extra := fmt.Sprintf(`os_images:
  img-plain: {uri: "oci://%s"}
  hand-declared: {uri: "%s"}
`, plain.Ref, unsignedUnderSylva)
	v := signedValues(t, reg, ours.PublicKeyPEM, extra, "img-00", "img-01", "img-02", "img-03", "img-04", "img-05")

	_, err = resolveValues(t, v, oci.Options{})
	failures := failuresByKey(t, err)
	want := map[string]string{
		"img-02":        "signed by another key",
		"img-03":        "the signed payload names another manifest digest",
		"img-04":        "no signature found",
		"hand-declared": "no signature found", // under the sylva registry's url: its key applies
	}
	if len(failures) != len(want) {
		t.Errorf("failures: %v", failures)
	}
	for key, reason := range want {
		f, ok := failures[key]
		if !ok {
			t.Errorf("%s was published", key)
			continue
		}
		for _, s := range []string{"Invalid signature for " + f.URI + ": " + reason, "os_images_oci_registries.sylva.cosign_publickey", "security.os_images.skip_signing_check"} {
			if !strings.Contains(f.Cause, s) {
				t.Errorf("%s: cause lacks %q: %s", key, s, f.Cause)
			}
		}
	}
	if !strings.Contains(err.Error(), "4 of 8 images could not be resolved") {
		t.Errorf("report: %v", err)
	}

	// Without the faulty ones, the catalog is published, with the digests
	// that were verified.
	v = signedValues(t, reg, ours.PublicKeyPEM, fmt.Sprintf("os_images:\n  img-plain: {uri: \"oci://%s\"}\n", plain.Ref), "img-00", "img-01", "img-05")
	cat, err := resolveValues(t, v, oci.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"img-00", "img-01", "img-05"} {
		if got, want := cat[name][osimage.FieldManifestDigest], published[name].ManifestDigest.String(); got != want {
			t.Errorf("%s.%s = %q, want %q", name, osimage.FieldManifestDigest, got, want)
		}
	}
	if cat["img-plain"][osimage.FieldManifestDigest] != plain.ManifestDigest.String() {
		t.Errorf("an unsigned image's digest is recorded too: %v", cat["img-plain"])
	}

	// skip_signing_check publishes every image.
	v = signedValues(t, reg, ours.PublicKeyPEM, extra+"security: {os_images: {skip_signing_check: true}}\n", "img-00", "img-01", "img-02", "img-03", "img-04", "img-05")
	cat, err = resolveValues(t, v, oci.Options{})
	if err != nil || len(cat) != 8 {
		t.Fatalf("skip_signing_check: %d images, %v", len(cat), err)
	}
	if cat["img-04"][osimage.FieldManifestDigest] != published["img-04"].ManifestDigest.String() {
		t.Errorf("unchecked images still record their digest: %v", cat["img-04"])
	}
}

func TestResolveFailsClosedWithoutVerifier(t *testing.T) {
	reg := testenv.Registry(t, devregistry.Options{})
	published := publish(t, reg, 1)
	s := testenv.Signer(t)
	testenv.Sign(t, reg, s, published["img-00"], devregistry.SignOptions{})
	plan, err := PlanFromValues(signedValues(t, reg, s.PublicKeyPEM, "", "img-00"), nil)
	if err != nil {
		t.Fatal(err)
	}
	client, err := oci.NewClient(oci.Options{Insecure: true})
	if err != nil {
		t.Fatal(err)
	}
	_, err = Resolve(context.Background(), plan, client, ResolveOptions{})
	if f := failuresByKey(t, err)["img-00"]; !strings.Contains(f.Cause, "no signature verifier") {
		t.Errorf("an image with a key is never published unverified: %v", err)
	}
}

func TestResolveDeclaredManifestDigest(t *testing.T) {
	reg := testenv.Registry(t, devregistry.Options{})
	p := publish(t, reg, 1)["img-00"]
	for _, tc := range []struct {
		pin  digest.Digest
		want string
	}{
		{p.ManifestDigest, ""},
		{digest.FromString("another manifest"), "manifest digest mismatch: os_images.img-00.oci-manifest-digest pins " + digest.FromString("another manifest").String()},
	} {
		v := dibValues(t, reg, true, "img-00")
		v["os_images"] = map[string]any{"img-00": map[string]any{"oci-manifest-digest": tc.pin.String()}}
		cat, err := resolveValues(t, v, oci.Options{})
		if tc.want == "" {
			if err != nil || cat["img-00"]["oci-manifest-digest"] != p.ManifestDigest.String() {
				t.Errorf("matching pin: %v %v", cat, err)
			}
			continue
		}
		if f := failuresByKey(t, err)["img-00"]; !strings.Contains(f.Cause, tc.want) || !strings.Contains(f.Cause, p.ManifestDigest.String()) {
			t.Errorf("pin mismatch: %v", f.Cause)
		}
	}
}

func TestPlanSigning(t *testing.T) {
	s := testenv.Signer(t)
	key := strings.ReplaceAll(strings.TrimSpace(s.PublicKeyPEM), "\n", "\n      ")
	withKey := strings.Replace(baseValues, "    tag: '{{ .Values.sylva_diskimagebuilder_version }}'\n",
		"    tag: '{{ .Values.sylva_diskimagebuilder_version }}'\n    cosign_publickey: |\n      "+key+"\n", 1)
	plan, err := PlanFromValues(mustParse(t, withKey), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, src := range plan.Sources {
		wantKey := src.RegistryKey == "sylva"
		if got := len(src.SigningKeys) == 1; got != wantKey {
			t.Errorf("%s: signing keys %v", src.Key, src.SigningKeys)
		}
	}

	base, _ := PlanFromValues(mustParse(t, baseValues), nil)
	if plan.InputsHash() == base.InputsHash() {
		t.Error("a new cosign_publickey does not change the inputs hash")
	}
	other := strings.ReplaceAll(strings.TrimSpace(testenv.Signer(t).PublicKeyPEM), "\n", "\n      ")
	plan2, _ := PlanFromValues(mustParse(t, strings.Replace(withKey, key, other, 1)), nil)
	if plan.InputsHash() == plan2.InputsHash() {
		t.Error("another cosign_publickey does not change the inputs hash")
	}
	skipped, err := PlanFromValues(mustParse(t, withKey+"security: {os_images: {skip_signing_check: true}}\n"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if skipped.InputsHash() == plan.InputsHash() || skipped.InputsHash() == base.InputsHash() {
		t.Error("skip_signing_check does not change the inputs hash")
	}
	if !skipped.SkipSigningCheck || len(skipped.KeyedRegistries) != 1 || len(skipped.Sources[0].SigningKeys) != 0 {
		t.Errorf("skipped plan: %+v", skipped)
	}

	for _, tc := range []struct{ name, values, want string }{
		{"bad key", `
os_images_oci_registries: {sylva: {url: oci://r/x, tag: "1", cosign_publickey: "not a key"}}`,
			"os_images_oci_registries.sylva.cosign_publickey: not a PEM public key"},
		{"skip not a boolean", `
security: {os_images: {skip_signing_check: perhaps}}`, "security.os_images.skip_signing_check: must be true or false"},
	} {
		_, err := PlanFromValues(mustParse(t, tc.values), nil)
		var inputErr *InputError
		if !errors.As(err, &inputErr) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: want an InputError with %q, got %v", tc.name, tc.want, err)
		}
	}
}
