package controller

import (
	"context"
	"errors"
	"fmt"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/sylva-projects/osimages/internal/fleet"
	"github.com/sylva-projects/osimages/internal/osimage"
)

const fleetNeedsFieldOwner = "osimages-fleet-needs"

// fleetNeedsReconciler publishes, in the management cluster's namespace,
// every image the workload clusters need, with the records of their own
// catalogs: the one document the image server reads to serve them
// (--serve-fleet-needs), so that it never reads workload namespaces. It
// builds it from what the check wrote (each namespace's osimages-status)
// and the namespaces' os-images-info, both persisted: a restart or a
// change of leader republishes the same document, never a partial one.
type fleetNeedsReconciler struct {
	target     types.NamespacedName
	namespaces labels.Selector
	reader     client.Reader
	writer     client.Client
	log        logr.Logger
}

// SetupWithManager reconciles the one document on any change of a
// namespace, a status, a catalog or the document itself; the work queue
// folds a burst of them into one reconcile.
func (r *fleetNeedsReconciler) SetupWithManager(mgr manager.Manager, options controller.Options) error {
	r.reader, r.writer = mgr.GetCache(), mgr.GetClient()
	r.log = mgr.GetLogger().WithValues("controller", "fleet-needs")
	one := []reconcile.Request{{NamespacedName: r.target}}
	toDocument := func(_ context.Context, obj client.Object) []reconcile.Request {
		if _, ok := obj.(*corev1.Namespace); ok {
			return one
		}
		switch {
		case obj.GetName() == osimage.StatusConfigMapName, obj.GetName() == osimage.InfoConfigMapName,
			obj.GetNamespace() == r.target.Namespace && obj.GetName() == r.target.Name:
			return one
		}
		return nil
	}
	options.MaxConcurrentReconciles = 1
	return builder.ControllerManagedBy(mgr).Named("fleet-needs").WithOptions(options).
		Watches(&corev1.Namespace{}, handler.EnqueueRequestsFromMapFunc(toDocument)).
		Watches(&corev1.ConfigMap{}, handler.EnqueueRequestsFromMapFunc(toDocument)).
		Complete(r)
}

func (r *fleetNeedsReconciler) Reconcile(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
	var nss corev1.NamespaceList
	if err := r.reader.List(ctx, &nss, client.MatchingLabelsSelector{Selector: r.namespaces}); err != nil {
		return reconcile.Result{}, err
	}
	var all []fleet.NamespaceNeeds
	for _, ns := range nss.Items {
		if ns.DeletionTimestamp != nil {
			continue
		}
		n, ok, err := r.read(ctx, ns.Name)
		if err != nil {
			return reconcile.Result{}, err
		}
		if ok {
			all = append(all, n)
		}
	}
	what := fmt.Sprintf("ConfigMap %s", r.target)
	data, err := fleet.Aggregate(all).Data(what)
	if err != nil {
		// Too large: the last document stays, and the check's statuses
		// still tell each cluster where it stands.
		r.log.Error(err, "the fleet's needs are not published")
		return reconcile.Result{}, nil
	}
	return reconcile.Result{}, r.write(ctx, data)
}

// read returns what namespace contributes: nothing until the check has
// written its status there.
func (r *fleetNeedsReconciler) read(ctx context.Context, namespace string) (fleet.NamespaceNeeds, bool, error) {
	var status corev1.ConfigMap
	err := r.reader.Get(ctx, types.NamespacedName{Namespace: namespace, Name: osimage.StatusConfigMapName}, &status)
	if apierrors.IsNotFound(err) {
		return fleet.NamespaceNeeds{}, false, nil
	}
	if err != nil {
		return fleet.NamespaceNeeds{}, false, err
	}
	if _, ours := status.Labels[osimage.StatusLabel]; !ours {
		return fleet.NamespaceNeeds{}, false, nil
	}
	report, err := osimage.ParseCheckReport(status.Data[osimage.StatusKey])
	if err != nil {
		r.log.Info("a status cannot be read; its namespace's needs are left out", "namespace", namespace, "error", err.Error())
		return fleet.NamespaceNeeds{}, false, nil
	}
	report.Namespace = namespace
	n := fleet.NamespaceNeeds{Report: report}
	var info corev1.ConfigMap
	err = r.reader.Get(ctx, types.NamespacedName{Namespace: namespace, Name: osimage.InfoConfigMapName}, &info)
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return fleet.NamespaceNeeds{}, false, err
	default:
		// An unreadable catalog gives no record: its needs are published
		// without a source, and the server can fetch nothing for them.
		if cat, err := osimage.ParseInfo([]byte(info.Data[osimage.ValuesKey])); err == nil {
			n.Catalog = cat
		}
	}
	return n, true, nil
}

// write creates or updates the document, conditional on the version read,
// and only when it changes.
func (r *fleetNeedsReconciler) write(ctx context.Context, data map[string]string) error {
	var previous corev1.ConfigMap
	err := r.reader.Get(ctx, r.target, &previous)
	switch {
	case apierrors.IsNotFound(err):
		cm := &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Namespace: r.target.Namespace, Name: r.target.Name, Labels: map[string]string{osimage.FleetNeedsLabel: ""}},
			Data:       data,
		}
		if err := r.writer.Create(ctx, cm, client.FieldOwner(fleetNeedsFieldOwner)); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating ConfigMap %s: %w", r.target, err)
		}
		return nil
	case err != nil:
		return err
	}
	if _, ours := previous.Labels[osimage.FleetNeedsLabel]; !ours {
		r.log.Error(errors.New("not created by osimages"), "the fleet's needs are not published: ConfigMap "+r.target.String()+" exists without the label "+osimage.FleetNeedsLabel+"; rename or delete it")
		return nil
	}
	if previous.Data[osimage.FleetNeedsKey] == data[osimage.FleetNeedsKey] && len(previous.Data) == 1 {
		return nil
	}
	updated := previous.DeepCopy()
	updated.Data, updated.BinaryData = data, nil
	if err := r.writer.Update(ctx, updated, client.FieldOwner(fleetNeedsFieldOwner)); err != nil && !apierrors.IsConflict(err) {
		return fmt.Errorf("updating ConfigMap %s: %w", r.target, err)
	}
	// A conflict: the watch event of the newer version brings it back.
	return nil
}
