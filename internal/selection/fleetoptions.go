package selection

import (
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/sylva-projects/osimages/internal/kube"
)

// FleetOptions are the flags of the fleet-needs policy, shared by serve
// and plan so that plan predicts what serve does.
type FleetOptions struct {
	Serve         bool
	AllowPrefixes []string
	MaxImages     int
	// MaxBytes is a quantity, such as 100Gi; "" or 0 is no bound.
	MaxBytes string

	// Policy is what Check made of them.
	Policy FleetPolicy
}

// Defaults of the quotas: a workload namespace normally needs the images
// of one or two Sylva releases (a two-step upgrade), a few per release;
// 10 images of up to 10 GiB leaves room for that and no more.
const (
	DefaultFleetMaxImages = 10
	DefaultFleetMaxBytes  = "100Gi"
)

// Check refuses flags that are wrong, naming them, and sets Policy. A
// wrong value is refused without --serve-fleet-needs too: it is as wrong
// the day the switch is turned on.
func (f *FleetOptions) Check() error {
	var errs []error
	if f.MaxImages < 0 {
		errs = append(errs, fmt.Errorf("--fleet-needs-max-images-per-namespace %d is negative: give 0 for no bound", f.MaxImages))
	}
	maxBytes, err := kube.Quantity("--fleet-needs-max-bytes-per-namespace", f.MaxBytes)
	if err == nil && maxBytes < 0 {
		err = fmt.Errorf("--fleet-needs-max-bytes-per-namespace %q is negative: give 0 for no bound", f.MaxBytes)
	}
	errs = append(errs, err)
	for _, p := range f.AllowPrefixes {
		u, err := url.Parse(p)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || !strings.HasSuffix(p, "/") || u.User != nil {
			errs = append(errs, fmt.Errorf("--fleet-needs-allow-prefix %q: give an http:// or https:// URL with a host and a path that ends with /, such as https://images.example.org/dib/", p))
		}
	}
	f.Policy = FleetPolicy{AllowPrefixes: f.AllowPrefixes, MaxImages: f.MaxImages, MaxBytes: maxBytes}
	return errors.Join(errs...)
}
