package controller

import (
	"context"
	"errors"
	"fmt"

	"github.com/sylva-projects/osimages/internal/osimage"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// errNotOurs refuses to write an osimages-status that osimages did not
// create (it lacks osimage.StatusLabel): a user's own ConfigMap of that
// name is never overwritten.
var errNotOurs = errors.New("not created by osimages")

// errStale is a write refused because the cache was behind the
// apiserver (a conflict, or an object created meanwhile): the reconcile
// runs again on fresher state. It is not an error worth a log at ERROR.
var errStale = errors.New("the cache was behind the apiserver")

// statusKeys are the keys of osimages-status, each with its writer.
var statusKeys = map[string]bool{osimage.StatusKey: true, osimage.CatalogStatusKey: true}

// statusConfigMap is the osimages-status of namespace, without data: what
// a write creates, and what the check's events regard.
func statusConfigMap(namespace string) *corev1.ConfigMap {
	return &corev1.ConfigMap{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{
			Name: osimage.StatusConfigMapName, Namespace: namespace,
			Labels: map[string]string{osimage.StatusLabel: ""},
		},
	}
}

// writeStatusKey sets one key of osimages-status (the check's status.yaml,
// the catalog's catalog.yaml) and leaves the others to their writer. The
// write is conditional on the resourceVersion read, creation on absence.
// It writes nothing when the key already holds doc.
func writeStatusKey(ctx context.Context, w client.Client, owner string, previous *corev1.ConfigMap, namespace, key, doc string) error {
	if previous == nil {
		cm := statusConfigMap(namespace)
		cm.Data = map[string]string{key: doc}
		return staleOr(w.Create(ctx, cm, client.FieldOwner(owner)))
	}
	if _, ours := previous.Labels[osimage.StatusLabel]; !ours {
		return fmt.Errorf("ConfigMap %s/%s: %w (no label %s); it is left as it is: rename or delete it so that osimages can report here",
			namespace, osimage.StatusConfigMapName, errNotOurs, osimage.StatusLabel)
	}
	stray := false
	for k := range previous.Data {
		stray = stray || !statusKeys[k]
	}
	if v, ok := previous.Data[key]; ok && v == doc && !stray && len(previous.BinaryData) == 0 {
		return nil
	}
	updated := previous.DeepCopy()
	if updated.Data == nil {
		updated.Data = map[string]string{}
	}
	// The object is ours: what its writers did not put there goes.
	for k := range updated.Data {
		if !statusKeys[k] {
			delete(updated.Data, k)
		}
	}
	updated.BinaryData = nil
	updated.Data[key] = doc
	return staleOr(w.Update(ctx, updated, client.FieldOwner(owner)))
}

// staleOr turns the refusals of a write decided on a stale cache into
// errStale.
func staleOr(err error) error {
	if apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("%w: %w", errStale, err)
	}
	return err
}
