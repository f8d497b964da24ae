package serve

import (
	"errors"
	"fmt"

	"github.com/sylva-projects/osimages/internal/fleet"
	"github.com/sylva-projects/osimages/internal/kube"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/selection"
	"github.com/sylva-projects/osimages/internal/server"
)

// FleetNeedsOptions are those of --serve-fleet-needs.
type FleetNeedsOptions struct {
	selection.FleetOptions
	// ConfigMap is NS/NAME of the fleet's needs; "" is
	// fleet.FleetNeedsConfigMapName in the namespace of the server's
	// other ConfigMaps.
	ConfigMap string
}

// fleetNeedsFromCluster points the inputs at the fleet-needs ConfigMap.
func (d *Daemon) fleetNeedsFromCluster() error {
	f := d.opts.FleetNeeds
	if !f.Serve {
		return nil
	}
	name := f.ConfigMap
	if name == "" {
		ns := ""
		for _, other := range []string{d.opts.OSImagesConfigMap, d.opts.OutputConfigMap} {
			if key, err := kube.ParseObjectKey(other); other != "" && err == nil {
				ns = key.Namespace
				break
			}
		}
		if ns == "" {
			return errors.New("--serve-fleet-needs: give --fleet-needs-configmap NS/NAME (no --os-images-configmap or --output-configmap names the server's namespace)")
		}
		name = ns + "/" + fleet.FleetNeedsConfigMapName
	}
	key, err := kube.ParseObjectKey(name)
	if err != nil {
		return fmt.Errorf("--fleet-needs-configmap %w", err)
	}
	d.inputs.FleetNeedsConfigMap = &key
	d.log.Info("serving the fleet's needs within policy", "configMap", key.String(), "allowPrefixes", f.AllowPrefixes,
		"maxImagesPerNamespace", f.Policy.MaxImages, "maxBytesPerNamespace", f.Policy.MaxBytes)
	return nil
}

// addFleetNeeds adds to the management selection the fleet's needs that
// the policy admits, and returns the refusals of the others. A needs
// document that cannot be used leaves the needs last used in force: a
// broken or foreign document never stops the management inputs, nor
// takes an image away from a cluster.
func (d *Daemon) addFleetNeeds(in server.Loaded, wanted map[string]selection.Wanted) (map[string]selection.Wanted, osimage.RefusedNeeds) {
	if !d.opts.FleetNeeds.Serve {
		return wanted, nil
	}
	for _, err := range in.NeedsDropped {
		d.log.Error("a fleet need is left out", "error", err.Error())
	}
	needs := in.Needs
	if in.NeedsError != nil {
		d.log.Error("the fleet's needs cannot be read; the needs last read stay in force, and the management inputs apply", "error", in.NeedsError.Error())
		needs = d.lastNeeds
	}
	if needs == nil {
		return wanted, nil
	}
	d.lastNeeds = needs
	policy := d.opts.FleetNeeds.Policy
	policy.Storage, policy.MaxImageSize = d.limits.MaxStorage, d.limits.MaxImageSize
	return selection.FleetNeeds(in.Values, *needs, wanted, d.srv.StoredSizes(), policy)
}
