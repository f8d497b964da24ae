package controller

import (
	"fmt"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/sylva-projects/osimages/internal/fleet"
)

// DefaultMaxInputSize bounds the data of the ConfigMaps tenants write for
// the controller (catalog-values, cluster-values): real sylva-units or
// sylva-capi-cluster values are tens of KiB.
const DefaultMaxInputSize = 512 << 10

// refusedSizeAnnotation marks, in the informer cache only, a tenant input
// whose data was dropped for its size; its value is the size. It never
// reaches the apiserver: the controller does not write tenant inputs.
const refusedSizeAnnotation = "osimages.sylva-project.org/refused-size"

// inputKind names the tenant inputs a ConfigMap holds, "" for none.
func inputKind(cm *corev1.ConfigMap) string {
	if _, ok := cm.Labels[fleet.CatalogValuesLabel]; ok {
		return fleet.CatalogValuesLabel
	}
	if _, ok := cm.Labels[fleet.ClusterValuesLabel]; ok {
		return fleet.ClusterValuesLabel
	}
	return ""
}

// dataSize is the size of a ConfigMap's data, keys included.
func dataSize(cm *corev1.ConfigMap) int {
	n := 0
	for k, v := range cm.Data {
		n += len(k) + len(v)
	}
	for k, v := range cm.BinaryData {
		n += len(k) + len(v)
	}
	return n
}

// limitInputs returns the part of the cache transform that keeps tenant
// inputs over max out of memory: their data is dropped, and the cached
// object marked with its size, so that the reconcilers refuse it (an
// event, the status) without holding or parsing it. written names the
// ConfigMaps the controller writes itself, which are never cut.
func limitInputs(max int, written func(*corev1.ConfigMap) bool) func(*corev1.ConfigMap) {
	return func(cm *corev1.ConfigMap) {
		// The mark is ours: a tenant cannot set it.
		delete(cm.Annotations, refusedSizeAnnotation)
		if inputKind(cm) == "" || written(cm) {
			return
		}
		if n := dataSize(cm); n > max {
			cm.Data, cm.BinaryData = nil, nil
			if cm.Annotations == nil {
				cm.Annotations = map[string]string{}
			}
			cm.Annotations[refusedSizeAnnotation] = strconv.Itoa(n)
		}
	}
}

// checkInputSizes refuses, with the reason, the tenant inputs of one kind
// in one namespace that were cut from the cache, and all of them when
// together they pass max: so that what one namespace makes the controller
// parse is bounded too. It returns the inputs that may be read.
func checkInputSizes(cms []corev1.ConfigMap, kind string, max int) ([]corev1.ConfigMap, error) {
	var ok []corev1.ConfigMap
	var refused []string
	total := 0
	for _, cm := range cms {
		if inputKind(&cm) != kind {
			continue
		}
		if s := cm.Annotations[refusedSizeAnnotation]; s != "" {
			n, _ := strconv.Atoi(s)
			refused = append(refused, fmt.Sprintf("ConfigMap %s/%s holds %s of data, over the %s limit of a %s ConfigMap (--max-input-size); it is not read",
				cm.Namespace, cm.Name, quantity(n), quantity(max), kind))
			continue
		}
		total += dataSize(&cm)
		ok = append(ok, cm)
	}
	if len(refused) > 0 {
		return nil, fmt.Errorf("%s; keep only what osimages reads in it, or raise --max-input-size", strings.Join(refused, "; "))
	}
	if total > max && len(ok) > 0 {
		return nil, fmt.Errorf("the %s ConfigMaps of namespace %s hold %s of data together, over the %s limit (--max-input-size); none is read: keep only what osimages reads in them",
			kind, ok[0].Namespace, quantity(total), quantity(max))
	}
	return ok, nil
}

func quantity(n int) string {
	if n%1024 == 0 {
		return strconv.Itoa(n/1024) + " KiB"
	}
	return strconv.Itoa(n) + " bytes"
}
