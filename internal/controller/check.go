package controller

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/sylva-projects/osimages/internal/fleet"
	"github.com/sylva-projects/osimages/internal/kube"
	"github.com/sylva-projects/osimages/internal/metal3"
	"github.com/sylva-projects/osimages/internal/osimage"
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
	// FleetNeeds is where the fleet's needs are published (zero: they are
	// not): the ConfigMap the image server reads with --serve-fleet-needs.
	FleetNeeds types.NamespacedName
	// DiscoveryInterval is how often the Metal3 kinds not served yet are
	// looked for (DefaultDiscoveryInterval when 0).
	DiscoveryInterval time.Duration
}

// DefaultDiscoveryInterval is how often the check looks for a capm3
// installed after it started, as the image server's tracker does.
const DefaultDiscoveryInterval = time.Minute

// Default names of the check.
const (
	DefaultServedCopy    = propagate.DefaultTargetName
	WorkloadClusterLabel = propagate.WorkloadClusterLabel
	checkFieldOwner      = "osimages-check"
	eventActionCheck     = "CheckServed"
	reasonImageNotServed = "ImageNotServed"
	// reasonFleetNeedRefused: the image server refuses to serve the
	// image for this namespace (serve --serve-fleet-needs). A reason of
	// its own: events of one reason fold into a series that keeps the
	// first note, and the refusal must show.
	reasonFleetNeedRefused  = "FleetNeedRefused"
	reasonImageNotAvailable = "ImageNotAvailable"
	reasonInputs            = "ClusterInputsProblem"
	reasonImagesServed      = "ImagesServed"
)

// checkReconciler is the served-set check: a thin shell over fleet.Read,
// fleet.Needs and fleet.Check, one namespace per reconcile.
type checkReconciler struct {
	opts   CheckOptions
	reader client.Reader
	writer client.Client
	// apiReader reads the Metal3MachineTemplate CRD, uncached.
	apiReader client.Reader
	recorder  events.EventRecorder
	metrics   *metrics
	log       logr.Logger

	// metal3 are the Metal3 kinds watched: those the apiserver serves,
	// found at start and looked for again while some are missing.
	mu     sync.Mutex
	metal3 []schema.GroupVersionKind
}

func newCheckReconciler(opts CheckOptions, m *metrics) *checkReconciler {
	return &checkReconciler{opts: opts, metrics: m}
}

// SetupWithManager watches the workload-cluster namespaces, their inputs
// and the Metal3 objects, and looks for the Metal3 kinds while capm3 is
// not installed.
func (c *checkReconciler) SetupWithManager(mgr manager.Manager, options controller.Options) error {
	c.reader, c.writer, c.apiReader = mgr.GetCache(), mgr.GetClient(), mgr.GetAPIReader()
	c.recorder = kube.BoundedEvents(mgr.GetEventRecorder(eventSource))
	c.log = mgr.GetLogger().WithValues("controller", "check")
	inputs := func(ctx context.Context, obj client.Object) []reconcile.Request {
		_, values := obj.GetLabels()[fleet.ClusterValuesLabel]
		switch obj.GetName() {
		case osimage.InfoConfigMapName, osimage.StatusConfigMapName, c.opts.ServedCopy:
			values = true
		}
		if values {
			return toNamespace(ctx, obj)
		}
		return nil
	}
	ctrl, err := builder.ControllerManagedBy(mgr).Named("check").WithOptions(options).
		Watches(&corev1.Namespace{}, handler.EnqueueRequestsFromMapFunc(toNamespace)).
		Watches(&corev1.ConfigMap{}, handler.EnqueueRequestsFromMapFunc(inputs)).
		Build(c)
	if err != nil {
		return fmt.Errorf("creating the check controller: %w", err)
	}
	d := &metal3Discovery{check: c, ctrl: ctrl, mapper: mgr.GetRESTMapper(), cache: mgr.GetCache(), interval: c.opts.DiscoveryInterval}
	// Known before the first reconcile: a namespace is never checked
	// without the templates capm3 already holds.
	if err := d.discover(); err != nil {
		return err
	}
	if !d.complete() {
		c.log.Info("the Metal3 API is not (all) served: the check reads the picks of cluster values, and looks again for capm3",
			"every", d.interval.String(), "watched", d.watched())
		return mgr.Add(d)
	}
	return nil
}

// metal3Kinds returns the Metal3 kinds watched so far.
func (c *checkReconciler) metal3Kinds() []schema.GroupVersionKind {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.metal3)
}

func (c *checkReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
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

	gathered, err := fleet.Read(ctx, c.reader, name, fleet.ReadOptions{
		ServedCopy: c.opts.ServedCopy,
		Metal3:     c.metal3Kinds(),
		Admit:      c.admit,
	})
	if err != nil {
		return reconcile.Result{}, err
	}
	// Read from the apiserver at each check (one object, not cached): a
	// CAPM3 upgraded to accept oci:// images is seen at the next resync.
	if gathered.Inputs.OCIRefused, err = metal3.ReadOCIRefusal(ctx, c.apiReader); err != nil {
		return reconcile.Result{}, err
	}
	previous := gathered.Status
	needs, err := fleet.Needs(gathered.Inputs)
	report := fleet.Check(name, c.opts.ServedCopy, needs, gathered.Served, gathered.ServedFound, err)
	c.metrics.report(report)

	doc, err := osimage.MarshalCheckReport(report)
	if err != nil {
		return reconcile.Result{}, err
	}
	var before osimage.CheckReport
	if previous != nil {
		before, _ = osimage.ParseCheckReport(previous.Data[osimage.StatusKey])
	}
	err = writeStatusKey(ctx, c.writer, checkFieldOwner, previous, name, osimage.StatusKey, string(doc))
	switch {
	case errors.Is(err, errStale):
		log.FromContext(ctx).V(1).Info("status not written, deciding again", "reason", err.Error())
		return reconcile.Result{RequeueAfter: requeueStale}, nil
	case errors.Is(err, errNotOurs):
		c.recorder.Eventf(previous, ns, corev1.EventTypeWarning, string(reasonStatusNameTaken), eventActionCheck, "%v", err)
		c.log.Info("osimages-status not written: not ours", "namespace", name)
		return reconcile.Result{RequeueAfter: c.opts.Resync}, nil
	case err != nil:
		return reconcile.Result{}, fmt.Errorf("writing ConfigMap %s/%s: %w", name, osimage.StatusConfigMapName, err)
	}
	c.announce(statusConfigMap(name), ns, before, previous != nil, report)
	return reconcile.Result{RequeueAfter: c.opts.Resync}, nil
}

// admit keeps the cluster values over the size limit from being parsed:
// they are refused, with the reason.
func (c *checkReconciler) admit(cms []corev1.ConfigMap) ([]corev1.ConfigMap, error) {
	clusters, err := checkInputSizes(cms, fleet.ClusterValuesLabel, c.opts.MaxInputSize)
	readable := cms[:0:0]
	for _, cm := range cms {
		if inputKind(&cm) != fleet.ClusterValuesLabel {
			readable = append(readable, cm)
		}
	}
	return append(readable, clusters...), err
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
func (c *checkReconciler) announce(status *corev1.ConfigMap, ns *corev1.Namespace, before osimage.CheckReport, hadBefore bool, now osimage.CheckReport) {
	old := map[osimage.SHA256]osimage.ImageStatus{}
	for _, img := range before.Images {
		old[img.SHA256] = img
	}
	for _, img := range now.Problems() {
		// A new reason (the image server's refusal arriving) is news too.
		if prev, ok := old[img.SHA256]; hadBefore && ok && prev.State == img.State && prev.Message == img.Message {
			continue
		}
		reason := reasonImageNotServed
		switch {
		case img.State == osimage.StateNotAvailable:
			reason = reasonImageNotAvailable
		case img.Refused != "":
			reason = reasonFleetNeedRefused
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
