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

// needsLeftOut adds to refused a refusal, for each namespace a need of
// wanted is served for, of every need left out of mgmt for why.
func needsLeftOut(wanted, mgmt map[string]selection.Wanted, refused osimage.RefusedNeeds, why error) osimage.RefusedNeeds {
	seen := map[string]bool{}
	for sha, w := range wanted {
		if _, ok := mgmt[sha]; ok {
			continue
		}
		for _, ns := range w.ForNamespaces {
			if !seen[ns] {
				seen[ns] = true
				refused = append(refused, osimage.RefusedNeed{Namespace: ns, Reason: osimage.RefusedStorage,
					Message: "the served set with the fleet's needs would be refused (" + why.Error() + "): the management selection is served alone until it fits"})
			}
		}
	}
	refused.Sort()
	return refused
}
