package controller

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sylva-projects/osimages/internal/fleet"
	"github.com/sylva-projects/osimages/internal/kube"
	"github.com/sylva-projects/osimages/internal/testenv"
)

// A refusal longer than the apiserver takes in an event note (1 KiB) still
// reaches the tenant's namespace, clipped: the apiserver refused the whole
// event, so the tenant got none.
func TestLongCatalogRefusalReachesTheNamespace(t *testing.T) {
	namespace(t, "catalog-long", nil)
	startManager(t, Options{Catalog: &CatalogOptions{}})
	var doc strings.Builder
	doc.WriteString("sylva_diskimagebuilder_images:\n")
	for i := range 40 {
		fmt.Fprintf(&doc, "  image-%02d: {os_images_oci_registry: nowhere}\n", i)
	}
	put(t, "catalog-long", "inputs", map[string]string{fleet.CatalogValuesLabel: ""}, doc.String())
	testenv.Eventually(t, "a CatalogValuesInvalid event", 30*time.Second, func() (bool, string) {
		evs := eventNotes(t, "catalog-long", "CatalogValuesInvalid")
		return len(evs) == 1 && strings.Contains(evs[0], "sylva_diskimagebuilder_images.image-00.os_images_oci_registry ('nowhere') is not defined") &&
			strings.Contains(evs[0], "[clipped: "), fmt.Sprint(evs)
	})
	note := strings.TrimSuffix(eventNotes(t, "catalog-long", "CatalogValuesInvalid")[0], " (x1)")
	if len(note) > kube.MaxEventNote {
		t.Errorf("the note has %d bytes, more than %d", len(note), kube.MaxEventNote)
	}
	// The status keeps the whole refusal.
	if s := catalogStatusOf(t, "catalog-long"); !strings.Contains(s.Message, "image-39") {
		t.Errorf("the status lacks the last refusal: %q", s.Message)
	}
}
