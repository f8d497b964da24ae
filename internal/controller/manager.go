// Package controller is what `osimages controller` runs: one
// controller-runtime manager for the management cluster that runs, each
// part switched on or off, the catalog of every namespace holding catalog inputs, the
// propagation of the served set, and the served-set check of every
// workload-cluster namespace. Each part is a thin reconciler over the pure
// logic of its own package (catalog, propagate, fleet).
package controller

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

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

// eventSource names the controller in the events it records.
const eventSource = "osimages-controller"

// NewManager builds the manager with the parts switched on: it sets up the
// cache they share and adds their reconcilers.
func NewManager(cfg *rest.Config, o Options) (manager.Manager, error) {
	if o.Catalog == nil && o.Propagate == nil && o.Check == nil {
		return nil, errors.New("every part is switched off: enable at least one of the catalog, propagation and check")
	}
	o = o.withDefaults()
	mgr, err := o.ManagerOptions.NewManager(cfg, o.cacheOptions(), DefaultLeaderElectionID)
	if err != nil {
		return nil, err
	}
	m, err := newMetrics(o.Registerer)
	if err != nil {
		return nil, fmt.Errorf("registering metrics: %w", err)
	}
	options := controller.Options{MaxConcurrentReconciles: o.Workers, SkipNameValidation: ptr.To(true)}
	if o.Propagate != nil {
		p := *o.Propagate
		p.Registerer = o.Registerer
		if err := propagate.AddToManager(mgr, p); err != nil {
			return nil, err
		}
	}
	if o.Catalog != nil {
		if err := newCatalogReconciler(*o.Catalog, o.Workers, m).SetupWithManager(mgr, options); err != nil {
			return nil, err
		}
	}
	if o.Check != nil {
		if err := newCheckReconciler(*o.Check, m).SetupWithManager(mgr, options); err != nil {
			return nil, err
		}
		if o.Check.FleetNeeds.Name != "" {
			r := &fleetNeedsReconciler{target: o.Check.FleetNeeds, namespaces: o.Check.Namespaces}
			if err := r.SetupWithManager(mgr, options); err != nil {
				return nil, err
			}
		}
	}
	return mgr, nil
}

func (o Options) withDefaults() Options {
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
	if o.Catalog != nil {
		c := *o.Catalog
		if c.MaxInputSize <= 0 {
			c.MaxInputSize = o.MaxInputSize
		}
		o.Catalog = &c
	}
	if o.Check != nil {
		c := *o.Check
		if c.MaxInputSize <= 0 {
			c.MaxInputSize = o.MaxInputSize
		}
		if c.ServedCopy == "" {
			c.ServedCopy = DefaultServedCopy
		}
		if c.Namespaces == nil {
			c.Namespaces = labels.SelectorFromSet(labels.Set{WorkloadClusterLabel: ""})
		}
		if c.Resync <= 0 {
			c.Resync = o.Resync
		}
		if c.DiscoveryInterval <= 0 {
			c.DiscoveryInterval = DefaultDiscoveryInterval
		}
		o.Check = &c
	}
	return o
}

// cacheOptions keep in memory only what the parts read: tenant inputs
// within their size limit, the ConfigMaps the parts write, slim
// Namespaces and Metal3 objects.
func (o Options) cacheOptions() cache.Options {
	var rules []propagate.Rule
	if o.Propagate != nil {
		rules = o.Propagate.Rules
	}
	servedCopy, fleetNeeds := "", types.NamespacedName{}
	if o.Check != nil {
		servedCopy, fleetNeeds = o.Check.ServedCopy, o.Check.FleetNeeds
	}
	written := func(cm *corev1.ConfigMap) bool {
		return propagate.Relevant(rules, cm.Namespace, cm.Name) || cm.Name == osimage.InfoConfigMapName ||
			cm.Name == osimage.StatusConfigMapName || (servedCopy != "" && cm.Name == servedCopy) ||
			(fleetNeeds.Name != "" && cm.Namespace == fleetNeeds.Namespace && cm.Name == fleetNeeds.Name)
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
	return cache.Options{
		SyncPeriod: &o.Resync,
		ByObject: map[client.Object]cache.ByObject{
			&corev1.ConfigMap{}: {Transform: transform, UnsafeDisableDeepCopy: ptr.To(true)},
			&corev1.Namespace{}: {Transform: propagate.SlimNamespace, UnsafeDisableDeepCopy: ptr.To(true)},
		},
		// The Metal3 kinds, whose informers may start while the manager
		// runs (metal3Discovery), are slimmed by the default transform.
		DefaultTransform: metal3.Transform,
	}
}

// toNamespace maps an object to its namespace, and a Namespace to itself:
// each part reconciles one namespace at a time.
func toNamespace(_ context.Context, obj client.Object) []reconcile.Request {
	ns := obj.GetNamespace()
	if ns == "" {
		ns = obj.GetName() // the namespace itself
	}
	return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: ns}}}
}

// Run builds the manager and runs it until ctx ends.
func Run(ctx context.Context, cfg *rest.Config, o Options) error {
	mgr, err := NewManager(cfg, o)
	if err != nil {
		return err
	}
	return mgr.Start(ctx)
}
