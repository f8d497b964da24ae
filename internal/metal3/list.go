package metal3

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Kinds are the kinds that reference images, in the order they are listed.
var Kinds = []string{KindMachineTemplate, KindMachine}

// ServedKinds returns the kinds of Kinds that the apiserver serves, each in
// its preferred version: none when capm3 is not installed. A mapper that
// looks again on a miss (controller-runtime's) sees a capm3 installed
// later.
func ServedKinds(mapper meta.RESTMapper) ([]schema.GroupVersionKind, error) {
	var out []schema.GroupVersionKind
	for _, kind := range Kinds {
		m, err := mapper.RESTMapping(schema.GroupKind{Group: Group, Kind: kind})
		if meta.IsNoMatchError(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("looking up %s: %w", kind, err)
		}
		out = append(out, m.GroupVersionKind)
	}
	return out, nil
}

// List returns the objects of the given kinds in namespace, kind after
// kind.
func List(ctx context.Context, c client.Reader, namespace string, kinds []schema.GroupVersionKind) ([]*unstructured.Unstructured, error) {
	var out []*unstructured.Unstructured
	for _, gvk := range kinds {
		list := &unstructured.UnstructuredList{}
		list.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
		if err := c.List(ctx, list, client.InNamespace(namespace)); err != nil {
			return nil, err
		}
		for i := range list.Items {
			out = append(out, &list.Items[i])
		}
	}
	return out, nil
}

// Transform is a cache transform that slims the objects of Kinds
// (SlimObject) and leaves every other object as it is: it can be a
// cache's default transform, for kinds whose informers start while the
// cache runs (capm3 installed later).
func Transform(obj any) (any, error) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok || u.GroupVersionKind().Group != Group {
		return obj, nil
	}
	for _, kind := range Kinds {
		if u.GetKind() == kind {
			return SlimObject(u, kind), nil
		}
	}
	return obj, nil
}
