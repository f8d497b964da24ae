package serve

import (
	"errors"
	"fmt"
	"maps"

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
// the policy admits, and returns the refusals of the others.
func (d *Daemon) addFleetNeeds(in server.Loaded, wanted map[string]selection.Wanted) (map[string]selection.Wanted, osimage.RefusedNeeds) {
	if !d.opts.FleetNeeds.Serve || in.Needs == nil {
		return wanted, nil
	}
	served := d.srv.Served()
	isServed := func(sha string) bool { _, ok := served[sha]; return ok }
	added, refused := selection.FleetNeeds(in.Values, *in.Needs, wanted, isServed, d.opts.FleetNeeds.Policy)
	if len(added) == 0 {
		return wanted, refused
	}
	out := maps.Clone(wanted)
	maps.Copy(out, added)
	return out, refused
}
