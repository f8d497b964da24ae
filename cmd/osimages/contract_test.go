package main

import (
	"os"
	"strings"
	"testing"

	"github.com/sylva-projects/osimages/internal/catalog"
	"github.com/sylva-projects/osimages/internal/controller"
	"github.com/sylva-projects/osimages/internal/fleet"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/propagate"
)

// TestContractDocumentsEveryConfigMap holds docs/contract.md, the
// reference users have of the formats, to the names the code reads and
// writes: every ConfigMap, data key, label and annotation of the exchange.
// The README's documentation table links it.
func TestContractDocumentsEveryConfigMap(t *testing.T) {
	data, err := os.ReadFile("../../docs/contract.md")
	if err != nil {
		t.Fatalf("the contract users read is missing: %v", err)
	}
	doc := string(data)
	for _, name := range []string{
		osimage.InfoConfigMapName, osimage.InfoLabel, osimage.ValuesKey,
		catalog.InputsHashAnnotation, catalog.DataHashAnnotation, catalog.AllowEmptyAnnotation, osimage.FieldManifestDigest,
		osimage.ServedConfigMapName, "capm3_os_image_server_images", osimage.ServedFilenamesKey, "served_filenames",
		osimage.RefusedNeedsKey, "refused_needs",
		controller.DefaultServedCopy, propagate.LabelRule, propagate.LabelSourceNamespace, propagate.LabelSourceName,
		propagate.AnnotationSourceHash, propagate.AnnotationOwnerProof, propagate.AnnotationStaleSince, propagate.AnnotationPicks,
		osimage.StatusConfigMapName, osimage.StatusKey, osimage.StatusLabel, osimage.CatalogStatusKey,
		osimage.FleetNeedsConfigMapName, osimage.FleetNeedsKey, osimage.FleetNeedsLabel,
		osimage.RefusedRegistry, osimage.RefusedURI, osimage.RefusedImages, osimage.RefusedBytes, osimage.RefusedStorage,
		osimage.RefusedNoRecord, osimage.RefusedInvalid, osimage.RefusedDocumentShare, osimage.RefusedDownload,
		fleet.CatalogValuesLabel, fleet.ClusterValuesLabel,
		string(osimage.StateServed), string(osimage.StateNotAvailable), string(osimage.StateNotServed),
		osimage.CatalogRunning, osimage.CatalogPublished, osimage.CatalogFailed, osimage.CatalogTimedOut, osimage.CatalogRefused,
	} {
		if !strings.Contains(doc, name) {
			t.Errorf("docs/contract.md does not name %q", name)
		}
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), "| [docs/contract.md](docs/contract.md) |") {
		t.Error("the README's documentation table does not link docs/contract.md")
	}
}
