package main

import (
	"github.com/spf13/pflag"

	"github.com/sylva-projects/osimages/internal/selection"
)

// addFleetNeedsFlags adds the flags of the fleet-needs policy, the same
// for serve and for plan, which predicts what serve does.
func addFleetNeedsFlags(f *pflag.FlagSet, o *selection.FleetOptions, verb string) {
	f.BoolVar(&o.Serve, "serve-fleet-needs", false, verb+" the images the workload clusters need (the controller's --fleet-needs ConfigMap), within policy: a registry of os_images_oci_registries or an allowed HTTP(S) prefix, the management signature keys, per-namespace quotas and --max-storage")
	f.StringArrayVar(&o.AllowPrefixes, "fleet-needs-allow-prefix", nil, "with --serve-fleet-needs, an http:// or https:// prefix, ending with /, under which a needed image may be downloaded; repeat for several (OCI images need a registry of the management os_images_oci_registries)")
	f.IntVar(&o.MaxImages, "fleet-needs-max-images-per-namespace", selection.DefaultFleetMaxImages, "with --serve-fleet-needs, at most this many images served because one namespace needs them (0: no bound)")
	f.StringVar(&o.MaxBytes, "fleet-needs-max-bytes-per-namespace", selection.DefaultFleetMaxBytes, "with --serve-fleet-needs, at most this many bytes of images served because one namespace needs them, as a quantity (0: no bound)")
}
