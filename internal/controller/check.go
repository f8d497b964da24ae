package controller

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/sylva-projects/osimages/internal/fleet"
	"github.com/sylva-projects/osimages/internal/propagate"
)

// CheckOptions configure the served-set check.
type CheckOptions struct {
	// Namespaces selects the workload-cluster namespaces checked.
	// Default: sylva-project.org/workload-cluster (Sylva's propagation
	// selector).
	Namespaces labels.Selector
	// ServedCopy is the name of the propagated served set in each
	// namespace (default kyverno-cloned-os-image-server-images).
	ServedCopy string
	// Resync is how often each namespace is checked without an event.
	Resync time.Duration
	// MaxInputSize bounds the data of the cluster-values ConfigMaps of a
	// namespace (DefaultMaxInputSize when 0).
	MaxInputSize int
}

// Default names of the check.
const (
	DefaultServedCopy       = propagate.DefaultTargetName
	WorkloadClusterLabel    = propagate.WorkloadClusterLabel
	checkFieldOwner         = "osimages-check"
	eventActionCheck        = "CheckServed"
	reasonImageNotServed    = "ImageNotServed"
	reasonImageNotAvailable = "ImageNotAvailable"
	reasonInputs            = "ClusterInputsProblem"
	reasonImagesServed      = "ImagesServed"
)

// checker is the served-set check: a thin shell over fleet.Needs and
// fleet.Check, one namespace per reconcile.
type checker struct {
	opts     CheckOptions
	reader   client.Reader
	writer   client.Client
	recorder events.EventRecorder
	metrics  *metrics
	// metal3 lists the Metal3 kinds served by the apiserver (none when
	// capm3 is not installed).
	metal3 []schema.GroupVersionKind
	log    logr.Logger
}

func (c *checker) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	name := req.Name
	ns := &corev1.Namespace{}
	if err := c.reader.Get(ctx, types.NamespacedName{Name: name}, ns); err != nil {
		if apierrors.IsNotFound(err) {
			c.metrics.forget(name)
			return reconcile.Result{}, nil
		}
		return reconcile.Result{}, err
	}
	if !c.opts.Namespaces.Matches(labels.Set(ns.Labels)) || ns.DeletionTimestamp != nil {
		c.metrics.forget(name)
		return reconcile.Result{}, nil
	}

	var cms corev1.ConfigMapList
	if err := c.reader.List(ctx, &cms, client.InNamespace(name)); err != nil {
		return reconcile.Result{}, err
	}
	var objects []*unstructured.Unstructured
	for _, gvk := range c.metal3 {
		list := &unstructured.UnstructuredList{}
		list.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
		if err := c.reader.List(ctx, list, client.InNamespace(name)); err != nil {
			return reconcile.Result{}, err
		}
		for i := range list.Items {
			objects = append(objects, &list.Items[i])
		}
	}
	// Cluster values over the size limit are refused, not parsed.
	clusters, sizeErr := checkInputSizes(cms.Items, fleet.ClusterValuesLabel, c.opts.MaxInputSize)
	readable := cms.Items[:0:0]
	for _, cm := range cms.Items {
		if inputKind(&cm) != fleet.ClusterValuesLabel {
			readable = append(readable, cm)
		}
	}
	readable = append(readable, clusters...)
	gathered := fleet.Gather(name, c.opts.ServedCopy, readable, objects)
	previous := gathered.Status
	needs, err := fleet.Needs(gathered.Inputs)
	report := fleet.Check(name, c.opts.ServedCopy, needs, gathered.Served, gathered.ServedFound, errors.Join(sizeErr, err))
	c.metrics.report(report)

	cm, err := report.ConfigMap()
	if err != nil {
		return reconcile.Result{}, err
	}
	var before fleet.Report
	if previous != nil {
		before, _ = fleet.ParseStatus(previous.Data[fleet.StatusKey])
	}
	err = writeStatusKey(ctx, c.writer, checkFieldOwner, previous, name, fleet.StatusKey, cm.Data[fleet.StatusKey])
	switch {
	case errors.Is(err, errStale):
		log.FromContext(ctx).V(1).Info("status not written, deciding again", "reason", err.Error())
		return reconcile.Result{RequeueAfter: requeueStale}, nil
	case errors.Is(err, errNotOurs):
		c.recorder.Eventf(previous, ns, corev1.EventTypeWarning, reasonStatusNameTaken, eventActionCheck, "%v", err)
		c.log.Info("osimages-status not written: not ours", "namespace", name)
		return reconcile.Result{RequeueAfter: c.opts.Resync}, nil
	case err != nil:
		return reconcile.Result{}, fmt.Errorf("writing ConfigMap %s/%s: %w", name, fleet.StatusConfigMapName, err)
	}
	c.announce(cm, ns, before, previous != nil, report)
	return reconcile.Result{RequeueAfter: c.opts.Resync}, nil
}

// requeueStale is how soon a write refused on a stale cache is decided
// again; the watch event that brings the cache up to date requeues too.
const requeueStale = time.Second

// announce emits an event for each problem that is new since the last
// check, and one when every problem is gone: a warning before render
// fails, without an event per resync. The events regard the status
// ConfigMap and relate to the Namespace, so that they live in the
// namespace (`kubectl get events -n NS` shows them; an event regarding a
// Namespace itself would land in "default").
func (c *checker) announce(status *corev1.ConfigMap, ns *corev1.Namespace, before fleet.Report, hadBefore bool, now fleet.Report) {
	old := map[string]fleet.State{}
	for _, img := range before.Images {
		old[img.SHA256] = img.State
	}
	for _, img := range now.Problems() {
		if hadBefore && old[img.SHA256] == img.State {
			continue
		}
		reason := reasonImageNotServed
		if img.State == fleet.StateNotAvailable {
			reason = reasonImageNotAvailable
		}
		c.recorder.Eventf(status, ns, corev1.EventTypeWarning, reason, eventActionCheck, "%s; needed by %s", img.Message, strings.Join(img.NeededBy, ", "))
		c.log.Info("needed image not served", "namespace", ns.Name, "sha256", img.SHA256, "state", img.State, "neededBy", img.NeededBy)
	}
	oldErrs := map[string]bool{}
	for _, e := range before.Errors {
		oldErrs[e] = true
	}
	for _, e := range now.Errors {
		if !oldErrs[e] {
			c.recorder.Eventf(status, ns, corev1.EventTypeWarning, reasonInputs, eventActionCheck, "%s", e)
		}
	}
	if hadBefore && len(before.Problems()) > 0 && len(now.Problems()) == 0 {
		c.recorder.Eventf(status, ns, corev1.EventTypeNormal, reasonImagesServed, eventActionCheck, "every needed image is served: %s", now.Summary())
	}
}
