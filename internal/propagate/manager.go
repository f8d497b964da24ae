package propagate

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/sylva-projects/osimages/internal/kube"
)

// Options configure the propagation manager.
type Options struct {
	Rules []Rule
	// Adopt lets osimages take over objects of a target name that it did
	// not create (for instance the copies Kyverno made).
	Adopt bool
	// Resync is how often every copy is checked again even without an
	// event, so that a lost watch event cannot leave a copy stale for
	// ever. Default 10 minutes.
	Resync time.Duration
	// Workers is the number of copies reconciled at once. Default 8.
	Workers int

	// ManagerOptions: leader election (Lease DefaultLeaderElectionID by
	// default), endpoints and log.
	kube.ManagerOptions

	// Registerer receives the metrics. Default controller-runtime's
	// registry, which the metrics server serves.
	Registerer prometheus.Registerer
}

// DefaultLeaderElectionID names the Lease the replicas compete for.
const DefaultLeaderElectionID = "osimages-propagate"

// withDefaults checks o and fills in its defaults.
func (o Options) withDefaults() (Options, error) {
	if len(o.Rules) == 0 {
		return o, errors.New("no propagation rules")
	}
	if o.Resync == 0 {
		o.Resync = 10 * time.Minute
	}
	if o.Resync < 0 {
		return o, fmt.Errorf("resync period %s must be positive", o.Resync)
	}
	if o.Workers == 0 {
		o.Workers = 8
	}
	if o.Workers < 0 {
		return o, fmt.Errorf("workers %d must be positive", o.Workers)
	}
	if o.Registerer == nil {
		o.Registerer = ctrlmetrics.Registry
	}
	return o, nil
}

// NewManager builds the controller-runtime manager of the propagation
// controller: one informer per kind (ConfigMaps, Namespaces), the copy
// reconciler, metrics, health checks, and leader election when asked.
// Start it with its Start method.
func NewManager(cfg *rest.Config, o Options) (manager.Manager, error) {
	o, err := o.withDefaults()
	if err != nil {
		return nil, err
	}
	rules := o.Rules
	mgr, err := o.ManagerOptions.NewManager(cfg, cache.Options{
		// The informers replay every object at this period, and each
		// replay reconciles the copies it concerns.
		SyncPeriod: &o.Resync,
		ByObject: map[client.Object]cache.ByObject{
			&corev1.ConfigMap{}: {Transform: SlimConfigMaps(func(cm *corev1.ConfigMap) bool { return Relevant(rules, cm.Namespace, cm.Name) }), UnsafeDisableDeepCopy: ptr.To(true)},
			&corev1.Namespace{}: {Transform: SlimNamespace, UnsafeDisableDeepCopy: ptr.To(true)},
		},
	}, DefaultLeaderElectionID)
	if err != nil {
		return nil, err
	}
	if err := AddToManager(mgr, o); err != nil {
		return nil, err
	}
	return mgr, nil
}

// AddToManager adds the propagation controller and its metrics to mgr,
// whose ConfigMap cache must keep whole the ConfigMaps that Relevant names
// (see SlimConfigMaps); kube.ManagerOptions.NewManager adds the health
// checks.
func AddToManager(mgr manager.Manager, o Options) error {
	o, err := o.withDefaults()
	if err != nil {
		return err
	}
	m := newMetrics(o.Rules)
	c := newReconciler(o.Rules, nil, nil, nil, m, o.Adopt)
	c.reader = mgr.GetCache()
	c.observer = newObserver(c.reader)
	c.writer = mgr.GetClient()
	c.recorder = kube.BoundedEvents(mgr.GetEventRecorder(FieldOwner))
	c.log = mgr.GetLogger().WithValues("controller", "propagate")

	if err := mgr.GetFieldIndexer().IndexField(context.Background(), &corev1.ConfigMap{}, indexRule, func(obj client.Object) []string {
		if rule := obj.GetLabels()[LabelRule]; rule != "" {
			return []string{rule}
		}
		return nil
	}); err != nil {
		return fmt.Errorf("indexing ConfigMaps: %w", err)
	}

	err = builder.TypedControllerManagedBy[Key](mgr).
		Named("propagate").
		WithOptions(controller.TypedOptions[Key]{
			MaxConcurrentReconciles: o.Workers,
			// Names are unique in a process by construction (one
			// controller), but tests build it more than once.
			SkipNameValidation: ptr.To(true),
		}).
		WithLogConstructor(func(k *Key) logr.Logger {
			l := mgr.GetLogger().WithValues("controller", "propagate")
			if k != nil {
				l = l.WithValues("rule", k.Rule, "namespace", k.Namespace)
			}
			return l
		}).
		Watches(&corev1.ConfigMap{}, handler.TypedEnqueueRequestsFromMapFunc(c.keysForConfigMap)).
		Watches(&corev1.Namespace{}, handler.TypedEnqueueRequestsFromMapFunc(c.keysForNamespace)).
		Complete(c)
	if err != nil {
		return fmt.Errorf("creating the propagation controller: %w", err)
	}

	synced := func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		return mgr.GetCache().WaitForCacheSync(ctx)
	}
	m.reader, m.observer, m.ready, m.adopt = mgr.GetCache(), c.observer, synced, o.Adopt
	if err := o.Registerer.Register(m); err != nil {
		return fmt.Errorf("registering metrics: %w", err)
	}
	return nil
}

// Run builds the manager and runs it until ctx ends.
func Run(ctx context.Context, cfg *rest.Config, o Options) error {
	mgr, err := NewManager(cfg, o)
	if err != nil {
		return err
	}
	return mgr.Start(ctx)
}
