package fleet

import (
	"context"
	"errors"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sylva-projects/osimages/internal/metal3"
)

// ReadOptions say what Read reads in a namespace.
type ReadOptions struct {
	// ServedCopy names the namespace's copy of the served set; "" reads
	// none (the plan compares with the source instead).
	ServedCopy string
	// Metal3 are the Metal3 kinds served (metal3.ServedKinds): none when
	// capm3 is not installed.
	Metal3 []schema.GroupVersionKind
	// Admit, when set, is given the ConfigMaps before they are parsed,
	// and returns those that may be, with why the others may not (the
	// controller's size limits). What it refuses is Unreadable.
	Admit func([]corev1.ConfigMap) ([]corev1.ConfigMap, error)
}

// Read lists the ConfigMaps and the Metal3 objects of a namespace, through
// a client or a cache, and sorts them with Gather: what the check reads at
// each reconcile and the plan once per namespace.
func Read(ctx context.Context, c client.Reader, namespace string, o ReadOptions) (Namespace, error) {
	var cms corev1.ConfigMapList
	if err := c.List(ctx, &cms, client.InNamespace(namespace)); err != nil {
		return Namespace{}, err
	}
	objects, err := metal3.List(ctx, c, namespace, o.Metal3)
	if err != nil {
		return Namespace{}, err
	}
	readable := cms.Items
	var refused error
	if o.Admit != nil {
		readable, refused = o.Admit(cms.Items)
	}
	gathered := Gather(namespace, o.ServedCopy, readable, objects)
	if refused != nil {
		gathered.Unreadable = errors.Join(refused, gathered.Unreadable)
	}
	return gathered, nil
}
