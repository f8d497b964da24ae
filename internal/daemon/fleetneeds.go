package daemon

import (
	"github.com/sylva-projects/osimages/internal/kube"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/servedset"
	"github.com/sylva-projects/osimages/internal/serverio"
)

// FleetNeedsOptions are those of serving the fleet's needs.
type FleetNeedsOptions struct {
	// ConfigMap holds the fleet's needs.
	ConfigMap kube.ObjectKey
	// Policy is what of them is served.
	Policy servedset.FleetPolicy
}

// fleetNeedsFromCluster points the inputs at the fleet-needs ConfigMap.
func (d *Daemon) fleetNeedsFromCluster() {
	f := d.opts.FleetNeeds
	if f == nil {
		return
	}
	key := f.ConfigMap
	d.inputs.FleetNeedsConfigMap = &key
	d.log.Info("serving the fleet's needs within policy", "configMap", key.String(), "allowPrefixes", f.Policy.AllowPrefixes,
		"maxImagesPerNamespace", f.Policy.MaxImages, "maxBytesPerNamespace", f.Policy.MaxBytes)
}

// addFleetNeeds adds to the management selection the fleet's needs that
// the policy admits, and returns the refusals of the others. A needs
// document that cannot be used leaves the needs last used in force: a
// broken or foreign document never stops the management inputs, nor
// takes an image away from a cluster.
func (d *Daemon) addFleetNeeds(in serverio.Loaded, wanted map[osimage.SHA256]servedset.Wanted) (map[osimage.SHA256]servedset.Wanted, osimage.RefusedNeeds) {
	if d.opts.FleetNeeds == nil {
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
	return servedset.FleetNeeds(in.Values, *needs, wanted, d.srv.StoredSizes(), policy)
}

// needsLeftOut adds to refused a refusal, for each namespace a need of
// wanted is served for, of every need left out of mgmt for why.
func needsLeftOut(wanted, mgmt map[osimage.SHA256]servedset.Wanted, refused osimage.RefusedNeeds, why error) osimage.RefusedNeeds {
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
