package ocidist

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/sylva-projects/osimages/internal/osimage"
)

// TestOperationsDocSaysWhatIsBuilt keeps docs/operations.md's section on
// oci:// clients true to what Manifest and Index build: every fact it
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
	body, _ := Manifest(sumA, 42)
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
	for _, diskType := range osimage.OCIDiskTypes {
		ib, _ := Index(sumA, 42, diskType)
		var idx ocispec.Index
		if err := json.Unmarshal(ib, &idx); err != nil {
			t.Fatal(err)
		}
		for k, v := range idx.Manifests[0].Annotations {
			facts = append(facts, "`"+k+": ", "`"+v+"`")
		}
	}
	facts = append(facts, "`"+DiskTypeAnnotation+": raw`", "/images/<sha256>:raw")
	norm := func(s string) string { return strings.Join(strings.Fields(s), " ") }
	for _, f := range facts {
		if !strings.Contains(norm(section), norm(f)) {
			t.Errorf("docs/operations.md, Serving `oci://` clients: does not say %q, which is what internal/ocidist builds", f)
		}
	}
}
