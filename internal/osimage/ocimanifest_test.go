package osimage

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

var sumA = SHA256(strings.Repeat("a", 64))

func TestManifestDependsOnSHA256AndSizeOnly(t *testing.T) {
	body, d := OCIManifest(sumA, 42)
	again, d2 := OCIManifest(sumA, 42)
	if d != d2 || string(body) != string(again) {
		t.Fatalf("the same image gave two manifests:\n%s\n%s", body, again)
	}
	if _, o := OCIManifest(sumA, 43); o == d {
		t.Error("another size gave the same digest")
	}
	if _, o := OCIManifest(SHA256(strings.Repeat("b", 64)), 42); o == d {
		t.Error("another sha256 gave the same digest")
	}
	var m ocispec.Manifest
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatal(err)
	}
	if m.SchemaVersion != 2 || m.MediaType != ocispec.MediaTypeImageManifest || m.ArtifactType != OCIArtifactType || m.Config.Digest != ocispec.DescriptorEmptyJSON.Digest ||
		len(m.Layers) != 1 || m.Layers[0].Digest.String() != "sha256:"+string(sumA) || m.Layers[0].Size != 42 ||
		m.Layers[0].Annotations[ocispec.AnnotationTitle] != string(sumA)+".img" || len(m.Annotations) != 0 {
		t.Errorf("manifest: %s", body)
	}
	// The form render wrote before it wrote the disk type's tag.
	ref := OCIReference{Host: "10.0.0.1:8443", SHA256: sumA, Manifest: d}
	if got := ref.String(); got != "oci://10.0.0.1:8443/images/"+string(sumA)+"@"+d.String() {
		t.Errorf("reference %s", got)
	}
	if back, ok := ParseOCIReference(ref.String()); !ok || back != ref {
		t.Errorf("the reference does not read back: %+v %v", back, ok)
	}
	for _, bad := range []string{
		"oci://h/images/" + string(sumA) + ":tag",
		"oci://h/os-images@" + d.String(),
		"oci://h/images/" + strings.ToUpper(string(sumA)) + "@" + d.String(),
		"oci://h/images/" + string(sumA) + "@sha512:" + strings.Repeat("0", 128),
		"oci:///images/" + string(sumA) + "@" + d.String(),
		"https://h/images/" + string(sumA) + "@" + d.String(),
	} {
		if _, ok := ParseOCIReference(bad); ok {
			t.Errorf("%s read as an osimages reference", bad)
		}
	}
}

// TestOperationsDocSaysWhatIsBuilt keeps docs/operations.md's section on
// oci:// clients true to what OCIManifest and OCIIndex build: every fact it
// states of them is read from what they return, so a change of either
// fails here until the doc follows.
func TestOperationsDocSaysWhatIsBuilt(t *testing.T) {
	raw, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	start := strings.Index(doc, "### Serving `oci://` clients")
	end := strings.Index(doc, "### Status page, health and metrics")
	if start < 0 || end < start {
		t.Fatal("docs/operations.md has no section \"Serving `oci://` clients\" before \"Status page, health and metrics\"")
	}
	section := doc[start:end]
	body, _ := OCIManifest(sumA, 42)
	var m ocispec.Manifest
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatal(err)
	}
	title := strings.Replace(m.Layers[0].Annotations[ocispec.AnnotationTitle], string(sumA), "<sha256>", 1)
	facts := []string{
		"artifact type\n`" + m.ArtifactType + "`",
		"media type\n`" + m.Layers[0].MediaType + "`",
		"titled `" + title + "`",
	}
	if len(m.Annotations) == 0 && len(m.Layers) == 1 {
		facts = append(facts, "one layer", "no annotation")
	}
	for _, diskType := range OCIDiskTypes {
		ib, _ := OCIIndex(sumA, 42, diskType)
		var idx ocispec.Index
		if err := json.Unmarshal(ib, &idx); err != nil {
			t.Fatal(err)
		}
		for k, v := range idx.Manifests[0].Annotations {
			facts = append(facts, "`"+k+": ", "`"+v+"`")
		}
	}
	facts = append(facts, "`"+OCIDiskTypeAnnotation+": raw`", "/images/<sha256>:raw")
	norm := func(s string) string { return strings.Join(strings.Fields(s), " ") }
	for _, f := range facts {
		if !strings.Contains(norm(section), norm(f)) {
			t.Errorf("docs/operations.md, Serving `oci://` clients: does not say %q, which is what OCIManifest and OCIIndex build", f)
		}
	}
}
