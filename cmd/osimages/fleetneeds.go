package main

import (
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/sylva-projects/osimages/internal/kube"
	"github.com/sylva-projects/osimages/internal/servedset"
)

// fleetNeedsFlags are the flags of the fleet-needs policy, shared by serve
// and plan so that plan predicts what serve does.
type fleetNeedsFlags struct {
	serve         bool
	allowPrefixes []string
	maxImages     int
	// maxBytes is a quantity, such as 100Gi; "" or 0 is no bound.
	maxBytes string
}

// addFleetNeedsFlags adds the flags of the fleet-needs policy, the same
// for serve and for plan, which predicts what serve does.
func addFleetNeedsFlags(f *pflag.FlagSet, o *fleetNeedsFlags, verb string) {
	f.BoolVar(&o.serve, "serve-fleet-needs", false, verb+" the images the workload clusters need (the controller's --fleet-needs ConfigMap), within policy: under the url of a registry of os_images_oci_registries, or an allowed HTTP(S) prefix, the management signature keys, per-namespace quotas and --max-storage")
	f.StringArrayVar(&o.allowPrefixes, "fleet-needs-allow-prefix", nil, "with --serve-fleet-needs, an http:// or https:// prefix, ending with /, under which a needed image may be downloaded; repeat for several (OCI images must be under the url of a registry of the management os_images_oci_registries)")
	f.IntVar(&o.maxImages, "fleet-needs-max-images-per-namespace", servedset.DefaultFleetMaxImages, "with --serve-fleet-needs, at most this many images served because one namespace needs them (0: no bound)")
	f.StringVar(&o.maxBytes, "fleet-needs-max-bytes-per-namespace", resource.NewQuantity(servedset.DefaultFleetMaxBytes, resource.BinarySI).String(), "with --serve-fleet-needs, at most this many bytes of images served because one namespace needs them, as a quantity (0: no bound)")
}

// policy refuses flags that are wrong, naming them, and returns the policy
// they give. A wrong value is refused without --serve-fleet-needs too: it
// is as wrong the day the switch is turned on.
func (f fleetNeedsFlags) policy() (servedset.FleetPolicy, error) {
	var errs []error
	if f.maxImages < 0 {
		errs = append(errs, fmt.Errorf("--fleet-needs-max-images-per-namespace %d is negative: give 0 for no bound", f.maxImages))
	}
	maxBytes, err := kube.Quantity("--fleet-needs-max-bytes-per-namespace", f.maxBytes)
	if err == nil && maxBytes < 0 {
		err = fmt.Errorf("--fleet-needs-max-bytes-per-namespace %q is negative: give 0 for no bound", f.maxBytes)
	}
	errs = append(errs, err)
	for _, p := range f.allowPrefixes {
		u, err := url.Parse(p)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || !strings.HasSuffix(p, "/") || u.User != nil {
			errs = append(errs, fmt.Errorf("--fleet-needs-allow-prefix %q: give an http:// or https:// URL with a host and a path that ends with /, such as https://images.example.org/dib/", p))
		}
	}
	return servedset.FleetPolicy{AllowPrefixes: f.allowPrefixes, MaxImages: f.maxImages, MaxBytes: maxBytes}, errors.Join(errs...)
}
