package propagate

import (
	"context"
	"fmt"
	"time"

	"github.com/go-logr/logr"
	"github.com/sylva-projects/osimages/internal/osimage"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// FieldOwner names osimages' propagation in the managedFields of the copies.
const FieldOwner = "osimages-propagate"

// Key is one unit of work: the copy of one rule in one namespace.
type Key struct {
	Rule      string
	Namespace string
}

func (k Key) String() string { return k.Rule + "/" + k.Namespace }

// indexRule indexes the cached ConfigMaps by their LabelRule, so that the
// copies of a rule are found without scanning every ConfigMap.
const indexRule = "propagate.rule"

// requeueRace is how soon a write refused because the cache was behind
// the apiserver is tried again. The watch event that brings the cache up to
// date also requeues the key; this is only a safety net.
const requeueRace = time.Second

// reconciler is the copy reconciler: it reads from the informer cache, calls
// Decide, and writes what Decide asks.
type reconciler struct {
	rules    []Rule
	byName   map[string]Rule
	reader   client.Reader // the informer cache
	observer *observer
	writer   client.Client
	recorder events.EventRecorder
	metrics  *collector
	adopt    bool
	now      func() time.Time
	// log is for the event mappers, whose context carries no logger.
	log logr.Logger
}

func newReconciler(rules []Rule, reader client.Reader, writer client.Client, recorder events.EventRecorder, m *collector, adopt bool) *reconciler {
	c := &reconciler{rules: rules, byName: map[string]Rule{}, reader: reader, observer: newObserver(reader), writer: writer, recorder: recorder, metrics: m, adopt: adopt, now: time.Now, log: logr.Discard()}
	for _, r := range rules {
		c.byName[r.Name] = r
	}
	return c
}

func get(ctx context.Context, r client.Reader, key types.NamespacedName, obj client.Object) (bool, error) {
	err := r.Get(ctx, key, obj)
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	return err == nil, err
}

// Reconcile brings the copy of one rule in one namespace to what Decide
// says.
func (c *reconciler) Reconcile(ctx context.Context, k Key) (reconcile.Result, error) {
	r, ok := c.byName[k.Rule]
	if !ok {
		return reconcile.Result{}, nil
	}
	log := logr.FromContextOrDiscard(ctx)
	o, err := c.observer.observe(ctx, r, k.Namespace)
	if err != nil {
		c.metrics.reconcileError(r.Name)
		return reconcile.Result{}, err
	}
	d := Decide(r, o, c.adopt, c.now())
	switch d.Action {
	case ActionNone:
		switch d.State {
		case StateInSync:
			c.metrics.synced(r.Name, c.now())
		case StateConflict:
			reason := "TargetNameTaken"
			if !r.Selector.Matches(labels.Set(o.Namespace.Labels)) || (o.Copy.Immutable != nil && *o.Copy.Immutable) {
				reason = "OwnershipUnproven" // a delete held back
			}
			log.Info("not writing an object osimages cannot prove it owns", "reason", d.Reason)
			c.recorder.Eventf(o.Copy, o.Namespace, corev1.EventTypeWarning, reason, "Propagate", "rule %s: %s", r.Name, d.Reason)
		}
		return reconcile.Result{}, nil
	}

	err = c.write(ctx, d)
	switch {
	case err == nil:
		c.metrics.wrote(r.Name, d.Action)
		log.Info("propagated", "action", d.Action, "reason", d.Reason)
		switch d.Action {
		case ActionMarkStale:
			c.recorder.Eventf(d.Object, nil, corev1.EventTypeWarning, "SourceMissing", "Propagate", "rule %s: %s", r.Name, d.Reason)
		case ActionCreate, ActionUpdate:
			c.metrics.synced(r.Name, c.now())
			if o.Picks.Unreadable != nil {
				c.recorder.Eventf(d.Object, o.Namespace, corev1.EventTypeWarning, "CatalogUnreadable", "Propagate",
					"rule %s: %s; the copy keeps no served entry for it, so renders in this namespace fail until it is fixed", r.Name, o.Picks.Note)
			}
			if o.Copy != nil && o.Copy.Labels[LabelRule] == "" {
				c.recorder.Eventf(d.Object, nil, corev1.EventTypeNormal, "Adopted", "Propagate", "rule %s: adopted by osimages (--adopt)", r.Name)
			}
		}
		return reconcile.Result{}, nil
	case apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) || (apierrors.IsNotFound(err) && d.Action != ActionCreate):
		// The cache was behind: decide again on fresher state.
		log.V(1).Info("cache behind the apiserver; deciding again", "action", d.Action, "error", err.Error())
		return reconcile.Result{RequeueAfter: requeueRace}, nil
	default:
		c.metrics.reconcileError(r.Name)
		c.recorder.Eventf(o.Namespace, nil, corev1.EventTypeWarning, "PropagationFailed", "Propagate", "rule %s: %s of ConfigMap %s/%s failed: %v", r.Name, d.Action, k.Namespace, r.Target, err)
		return reconcile.Result{}, fmt.Errorf("rule %s: %s ConfigMap %s/%s: %w", r.Name, d.Action, k.Namespace, r.Target, err)
	}
}

// write carries out a decision. Every write is conditional on the state it
// was decided from (creation fails on an existing object, updates and
// deletions on a changed resourceVersion), so that an object changed since
// the cache saw it, perhaps by someone else, is never overwritten blindly.
func (c *reconciler) write(ctx context.Context, d Decision) error {
	switch d.Action {
	case ActionCreate:
		return c.writer.Create(ctx, d.Object, client.FieldOwner(FieldOwner))
	case ActionUpdate, ActionMarkStale:
		return c.writer.Update(ctx, d.Object, client.FieldOwner(FieldOwner))
	case ActionDelete:
		uid, rv := d.Object.UID, d.Object.ResourceVersion
		err := c.writer.Delete(ctx, d.Object, client.Preconditions{UID: &uid, ResourceVersion: &rv})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return err
	}
	return fmt.Errorf("unknown action %q", d.Action)
}

// keysForConfigMap maps a ConfigMap event to the copies it concerns: every
// copy of a rule whose source it is, or the one copy it is.
func (c *reconciler) keysForConfigMap(ctx context.Context, obj client.Object) []Key {
	var keys []Key
	for _, r := range c.rules {
		if obj.GetNamespace() == r.Source.Namespace && obj.GetName() == r.Source.Name {
			keys = append(keys, c.keysForRule(ctx, r)...)
		}
		if obj.GetName() == r.Target || (r.Catalog != "" && (obj.GetName() == r.Catalog || obj.GetName() == osimage.StatusConfigMapName)) {
			keys = append(keys, Key{Rule: r.Name, Namespace: obj.GetNamespace()})
		}
	}
	return keys
}

// keysForRule lists, from the cache, every namespace where the rule has a
// copy to make or to keep: the matching namespaces, and those that hold one
// of its copies.
func (c *reconciler) keysForRule(ctx context.Context, r Rule) []Key {
	log := c.log.WithValues("rule", r.Name)
	var keys []Key
	seen := map[string]bool{}
	var nss corev1.NamespaceList
	if err := c.reader.List(ctx, &nss, client.MatchingLabelsSelector{Selector: r.Selector}); err != nil {
		log.Error(err, "listing namespaces from the cache")
	}
	for i := range nss.Items {
		seen[nss.Items[i].Name] = true
		keys = append(keys, Key{Rule: r.Name, Namespace: nss.Items[i].Name})
	}
	var cms corev1.ConfigMapList
	if err := c.reader.List(ctx, &cms, client.MatchingFields{indexRule: r.Name}); err != nil {
		log.Error(err, "listing copies from the cache")
	}
	for i := range cms.Items {
		if ns := cms.Items[i].Namespace; !seen[ns] {
			seen[ns] = true
			keys = append(keys, Key{Rule: r.Name, Namespace: ns})
		}
	}
	return keys
}

func (c *reconciler) keysForNamespace(_ context.Context, obj client.Object) []Key {
	keys := make([]Key, len(c.rules))
	for i, r := range c.rules {
		keys[i] = Key{Rule: r.Name, Namespace: obj.GetName()}
	}
	return keys
}

// Relevant tells whether the propagation controller ever reads the content
// of ConfigMap namespace/name: the rules' sources, the objects of their
// target names, and for a rule with a Catalog, the catalogs and statuses
// that cut its copies down.
func Relevant(rules []Rule, namespace, name string) bool {
	for _, r := range rules {
		if name == r.Target || (namespace == r.Source.Namespace && name == r.Source.Name) {
			return true
		}
		if r.Catalog != "" && (name == r.Catalog || name == osimage.StatusConfigMapName) {
			return true
		}
	}
	return false
}

// SlimConfigMaps returns the cache transform of ConfigMaps. The one watch
// on ConfigMaps sees every ConfigMap of the cluster; only those keep says
// are read are kept whole (less their managedFields), the others are cut
// down to their name so that Helm releases and the like cost no memory.
func SlimConfigMaps(keep func(*corev1.ConfigMap) bool) func(any) (any, error) {
	return func(obj any) (any, error) {
		cm, ok := obj.(*corev1.ConfigMap)
		if !ok {
			return obj, nil
		}
		if !keep(cm) {
			slim := &corev1.ConfigMap{}
			slim.Name, slim.Namespace, slim.UID, slim.ResourceVersion = cm.Name, cm.Namespace, cm.UID, cm.ResourceVersion
			return slim, nil
		}
		// Updates send the cached object back whole, so nothing but
		// managedFields (which the apiserver keeps when absent) may be
		// dropped.
		cm.ManagedFields = nil
		return cm, nil
	}
}

// SlimNamespace keeps what Decide and events read of a namespace.
func SlimNamespace(obj any) (any, error) {
	ns, ok := obj.(*corev1.Namespace)
	if !ok {
		return obj, nil
	}
	slim := &corev1.Namespace{}
	slim.Name, slim.UID, slim.ResourceVersion = ns.Name, ns.UID, ns.ResourceVersion
	slim.Labels, slim.DeletionTimestamp = ns.Labels, ns.DeletionTimestamp
	slim.Status.Phase = ns.Status.Phase
	return slim, nil
}
