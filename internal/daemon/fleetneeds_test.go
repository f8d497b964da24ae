package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/sylva-projects/osimages/internal/fill"
	"github.com/sylva-projects/osimages/internal/imagestore"
	"github.com/sylva-projects/osimages/internal/oci"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/servedset"
	"github.com/sylva-projects/osimages/internal/server"
	"github.com/sylva-projects/osimages/internal/serverio"
	"github.com/sylva-projects/osimages/internal/values"
)

// The fleet's needs never keep the management selection from applying:
// when the served set with them would not fit in its ConfigMap, the
// management selection applies alone, and every namespace whose needs
// wait is told why (issue 23, items 1 and 3).
func TestTheFleetsNeedsNeverKeepTheManagementSelectionFromApplying(t *testing.T) {
	store, err := imagestore.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	log := slog.New(slog.DiscardHandler)
	clients, err := oci.NewClients(oci.Options{})
	if err != nil {
		t.Fatal(err)
	}
	srv := server.New(server.Config{Store: store})
	d := &Daemon{log: log, srv: srv, regs: fill.NewRegistries(clients, time.Minute, log),
		opts: Options{FleetNeeds: &FleetNeedsOptions{}}}

	long := func(i int, what string) string {
		return fmt.Sprintf("%s-%05d-%s.raw", what, i, strings.Repeat("x", 230))
	}
	uri := "oci://registry.example.org/dib/x:1"
	cat := osimage.Catalog{}
	for i := range 1500 {
		cat[fmt.Sprintf("mgmt-%05d", i)] = osimage.Image{osimage.FieldSHA256: fmt.Sprintf("%064x", i+1), osimage.FieldFilename: long(i, "mgmt"),
			osimage.FieldURI: uri, "os": "mgmt"}
	}
	var needs osimage.FleetNeeds
	for i := range 1000 {
		sha := fmt.Sprintf("%064x", 100000+i)
		ns := fmt.Sprintf("wc-%04d", i)
		rec := osimage.Image{osimage.FieldSHA256: sha, osimage.FieldFilename: long(i, "need"), osimage.FieldURI: uri, osimage.FieldSize: "1"}
		needs.Images = append(needs.Images, osimage.FleetNeed{SHA256: osimage.SHA256(sha), Namespaces: []string{ns},
			Sources: []osimage.NeedSource{{Key: "k", Image: rec, Namespaces: []string{ns}}}})
	}
	mgmt := values.Values{
		"os_images_oci_registries":       map[string]any{"r": map[string]any{"url": "oci://registry.example.org/dib"}},
		servedset.AdditionalSelectorsKey: map[string]any{"all": map[string]any{"os": "mgmt"}},
	}
	if err := d.apply(context.Background(), serverio.Loaded{Catalog: cat, Values: mgmt, Needs: &needs}); err != nil {
		t.Fatalf("the management selection is refused because of the fleet's needs: %v", err)
	}
	if n := len(srv.Served()); n != 1500 {
		t.Errorf("%d images served, want the 1500 of the management selection", n)
	}
	refused := srv.RefusedNeeds()
	if r, ok := refused.For("wc-0007", osimage.SHA256(fmt.Sprintf("%064x", 100007))); !ok || r.Reason != osimage.RefusedStorage || !strings.Contains(r.Message, "management selection is served alone") {
		t.Errorf("wc-0007's refusal: %+v", r)
	}
}
