// Package controller is `osimages controller`: one controller-runtime
// manager for the management cluster that runs, each part switched on or
// off, the catalog of every namespace holding catalog inputs, the
// propagation of the served set, and the served-set check of every
// workload-cluster namespace. Each part is a thin reconciler over the pure
// logic of its own package (catalog, propagate, fleet).
package controller

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/sylva-projects/osimages/internal/fleet"
	"github.com/sylva-projects/osimages/internal/kube"
	"github.com/sylva-projects/osimages/internal/metal3"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/propagate"
)

// DefaultLeaderElectionID names the Lease the replicas compete for.
const DefaultLeaderElectionID = "osimages-controller"

// Options configure the controller. A nil part is switched off.
type Options struct {
	Catalog   *CatalogOptions
	Propagate *propagate.Options
	Check     *CheckOptions

	// Workers is the number of namespaces reconciled at once per part.
	Workers int
	// Resync is how often the informers replay every object.
	Resync time.Duration
	// MaxInputSize bounds the data of one namespace's catalog-values
	// ConfigMaps, and of its cluster-values ConfigMaps (default
	// DefaultMaxInputSize). A ConfigMap over it is not held in memory.
	MaxInputSize int

	// ManagerOptions: leader election (Lease DefaultLeaderElectionID by
	// default), endpoints and log.
	kube.ManagerOptions
	// Registerer receives the metrics (default controller-runtime's).
	Registerer prometheus.Registerer
}

// NewManager builds the manager with the parts switched on.
func NewManager(cfg *rest.Config, o Options) (manager.Manager, error) {
	if o.Catalog == nil && o.Propagate == nil && o.Check == nil {
		return nil, errors.New("every part is switched off: enable at least one of the catalog, propagation and check")
	}
	if o.Workers <= 0 {
		o.Workers = 4
	}
	if o.Resync <= 0 {
		o.Resync = 10 * time.Minute
	}
	if o.Registerer == nil {
		o.Registerer = ctrlmetrics.Registry
	}
	if o.MaxInputSize <= 0 {
		o.MaxInputSize = DefaultMaxInputSize
	}
	if o.Check != nil {
		if o.Check.MaxInputSize <= 0 {
			o.Check.MaxInputSize = o.MaxInputSize
		}
		if o.Check.ServedCopy == "" {
			o.Check.ServedCopy = DefaultServedCopy
		}
		if o.Check.Namespaces == nil {
			o.Check.Namespaces = labels.SelectorFromSet(labels.Set{WorkloadClusterLabel: ""})
		}
		if o.Check.Resync <= 0 {
			o.Check.Resync = o.Resync
		}
	}
	var rules []propagate.Rule
	if o.Propagate != nil {
		rules = o.Propagate.Rules
	}
	servedCopy := ""
	if o.Check != nil {
		servedCopy = o.Check.ServedCopy
	}
	written := func(cm *corev1.ConfigMap) bool {
		return propagate.Relevant(rules, cm.Namespace, cm.Name) || cm.Name == osimage.InfoConfigMapName ||
			cm.Name == fleet.StatusConfigMapName || (servedCopy != "" && cm.Name == servedCopy)
	}
	keep := func(cm *corev1.ConfigMap) bool { return inputKind(cm) != "" || written(cm) }
	limit := limitInputs(o.MaxInputSize, written)
	slim := propagate.SlimConfigMaps(keep)
	transform := func(obj any) (any, error) {
		if cm, ok := obj.(*corev1.ConfigMap); ok {
			limit(cm)
		}
		return slim(obj)
	}
	byObject := map[client.Object]cache.ByObject{
		&corev1.ConfigMap{}: {Transform: transform, UnsafeDisableDeepCopy: ptr.To(true)},
		&corev1.Namespace{}: {Transform: propagate.SlimNamespace, UnsafeDisableDeepCopy: ptr.To(true)},
	}

	// The Metal3 kinds the check watches, when capm3 is installed.
	mapper, err := apiMapper(cfg)
	if err != nil {
		return nil, err
	}
	var metal3Kinds []schema.GroupVersionKind
	if o.Check != nil {
		for _, kind := range []string{metal3.KindMachineTemplate, metal3.KindMachine} {
			m, err := mapper.RESTMapping(schema.GroupKind{Group: metal3.Group, Kind: kind})
			if meta.IsNoMatchError(err) {
				o.Logger.Info("the Metal3 API is not served: the check reads the picks of cluster values only", "kind", kind)
				continue
			}
			if err != nil {
				return nil, fmt.Errorf("looking up %s: %w", kind, err)
			}
			metal3Kinds = append(metal3Kinds, m.GroupVersionKind)
			u := &unstructured.Unstructured{}
			u.SetGroupVersionKind(m.GroupVersionKind)
			byObject[u] = cache.ByObject{Transform: func(obj any) (any, error) { return metal3.SlimObject(obj, kind), nil }}
		}
	}

	mgr, err := o.ManagerOptions.NewManager(cfg, cache.Options{SyncPeriod: &o.Resync, ByObject: byObject}, DefaultLeaderElectionID)
	if err != nil {
		return nil, err
	}
	m, err := newMetrics(o.Registerer)
	if err != nil {
		return nil, fmt.Errorf("registering metrics: %w", err)
	}
	recorder := mgr.GetEventRecorder("osimages-controller")
	options := controller.Options{MaxConcurrentReconciles: o.Workers, SkipNameValidation: ptr.To(true)}
	toNamespace := func(_ context.Context, obj client.Object) []reconcile.Request {
		ns := obj.GetNamespace()
		if ns == "" {
			ns = obj.GetName() // the namespace itself
		}
		return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: ns}}}
	}

	if o.Propagate != nil {
		p := *o.Propagate
		// The manager's own readiness check covers every informer.
		p.Registerer, p.HealthAddr = o.Registerer, "0"
		if err := propagate.AddToManager(mgr, p); err != nil {
			return nil, err
		}
	}
	if o.Catalog != nil {
		co := *o.Catalog
		if co.MaxInputSize <= 0 {
			co.MaxInputSize = o.MaxInputSize
		}
		c := newCataloger(co, o.Workers)
		c.reader, c.writer, c.recorder, c.metrics = mgr.GetCache(), mgr.GetClient(), recorder, m
		c.log = mgr.GetLogger().WithValues("controller", "catalog")
		c.slots = newFairSlots(c.opts.Slots, func(ns string) { m.preemptions.WithLabelValues(ns).Inc() })
		m.running = c.runningSince
		if err := mgr.Add(c); err != nil {
			return nil, err
		}
		onlyInputs := func(ctx context.Context, obj client.Object) []reconcile.Request {
			if _, ok := obj.GetLabels()[fleet.CatalogValuesLabel]; ok || obj.GetName() == osimage.InfoConfigMapName {
				return toNamespace(ctx, obj)
			}
			return nil
		}
		err := builder.ControllerManagedBy(mgr).Named("catalog").WithOptions(options).
			Watches(&corev1.ConfigMap{}, handler.EnqueueRequestsFromMapFunc(onlyInputs)).
			WatchesRawSource(source.Channel(c.wake, handler.EnqueueRequestsFromMapFunc(toNamespace))).
			Complete(c)
		if err != nil {
			return nil, fmt.Errorf("creating the catalog controller: %w", err)
		}
	}
	if o.Check != nil {
		c := &checker{opts: *o.Check, reader: mgr.GetCache(), writer: mgr.GetClient(), recorder: recorder, metrics: m,
			metal3: metal3Kinds, log: mgr.GetLogger().WithValues("controller", "check")}
		onlyInputs := func(ctx context.Context, obj client.Object) []reconcile.Request {
			_, values := obj.GetLabels()[fleet.ClusterValuesLabel]
			switch obj.GetName() {
			case osimage.InfoConfigMapName, fleet.StatusConfigMapName, c.opts.ServedCopy:
				values = true
			}
			if values {
				return toNamespace(ctx, obj)
			}
			return nil
		}
		b := builder.ControllerManagedBy(mgr).Named("check").WithOptions(options).
			Watches(&corev1.Namespace{}, handler.EnqueueRequestsFromMapFunc(toNamespace)).
			Watches(&corev1.ConfigMap{}, handler.EnqueueRequestsFromMapFunc(onlyInputs))
		for _, gvk := range metal3Kinds {
			u := &unstructured.Unstructured{}
			u.SetGroupVersionKind(gvk)
			b = b.Watches(u, handler.EnqueueRequestsFromMapFunc(toNamespace))
		}
		if err := b.Complete(c); err != nil {
			return nil, fmt.Errorf("creating the check controller: %w", err)
		}
	}

	if o.HealthEnabled() {
		if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
			return nil, err
		}
		if err := mgr.AddReadyzCheck("caches", func(*http.Request) error {
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			defer cancel()
			if !mgr.GetCache().WaitForCacheSync(ctx) {
				return errors.New("informers not synced yet")
			}
			return nil
		}); err != nil {
			return nil, err
		}
	}
	return mgr, nil
}

// Run builds the manager and runs it until ctx ends.
func Run(ctx context.Context, cfg *rest.Config, o Options) error {
	mgr, err := NewManager(cfg, o)
	if err != nil {
		return err
	}
	return mgr.Start(ctx)
}

// apiMapper maps kinds to resources through discovery, before the manager
// (and its own mapper) exists.
func apiMapper(cfg *rest.Config) (meta.RESTMapper, error) {
	disc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disc)), nil
}
