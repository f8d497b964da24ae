package fleet

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/values"
)

// Namespace is what one workload-cluster namespace holds, sorted out of
// its ConfigMaps and Metal3 objects.
type Namespace struct {
	Inputs
	// Served is the namespace's copy of the served set, with the filenames
	// of its images when the copy carries them; ServedFound is false when
	// there is none.
	Served      osimage.ServedOutput
	ServedFound bool
	// Status is the current osimages-status ConfigMap, nil when absent.
	Status *corev1.ConfigMap
}

// Gather sorts the ConfigMaps and Metal3 objects of a namespace into what
// the check and the plan read: the cluster values (labelled
// ClusterValuesLabel), the catalog (os-images-info), the copy of the
// served set (servedCopy) and the last status. What cannot be read is
// kept in Inputs.Unreadable, and the rest gathered all the same.
func Gather(namespace, servedCopy string, cms []corev1.ConfigMap, objects []*unstructured.Unstructured) Namespace {
	out := Namespace{Inputs: Inputs{Namespace: namespace, Objects: objects}}
	var errs []error
	cms = slices.Clone(cms)
	slices.SortFunc(cms, func(a, b corev1.ConfigMap) int { return strings.Compare(a.Name, b.Name) })
	for i := range cms {
		cm := &cms[i]
		source := "ConfigMap " + namespace + "/" + cm.Name
		doc := []byte(cm.Data[osimage.ValuesKey])
		switch cm.Name {
		case servedCopy:
			s, err := osimage.ParseServed(doc)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", source, err))
				break
			}
			out.Served, out.ServedFound = osimage.ServedOutput{Set: s}, true
			if files, ok := cm.Data[osimage.ServedFilenamesKey]; ok {
				if out.Served.Filenames, err = osimage.ParseServedFilenames([]byte(files)); err != nil {
					errs = append(errs, fmt.Errorf("%s, key %s: %w", source, osimage.ServedFilenamesKey, err))
				}
			}
			if oci, ok := cm.Data[osimage.ServedOCIKey]; ok {
				if out.Served.OCI, err = osimage.ParseServedOCI([]byte(oci)); err != nil {
					errs = append(errs, fmt.Errorf("%s, key %s: %w", source, osimage.ServedOCIKey, err))
				}
			}
			if refused, ok := cm.Data[osimage.RefusedNeedsKey]; ok {
				if out.Served.Refused, err = osimage.ParseRefusedNeeds([]byte(refused)); err != nil {
					errs = append(errs, fmt.Errorf("%s, key %s: %w", source, osimage.RefusedNeedsKey, err))
				}
			}
		case osimage.InfoConfigMapName:
			cat, err := osimage.ParseInfo(doc)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", source, err))
				break
			}
			out.Catalog = cat
		case osimage.StatusConfigMapName:
			out.Status = cm
		}
		if _, ok := cm.Labels[ClusterValuesLabel]; ok {
			v, err := values.Parse(doc)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s, key %s: %w", source, osimage.ValuesKey, err))
				continue
			}
			out.Clusters = append(out.Clusters, ClusterValues{Source: source, Values: v})
		}
	}
	out.Unreadable = errors.Join(errs...)
	return out
}
