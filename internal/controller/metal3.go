package controller

import (
	"context"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/source"

	"github.com/sylva-projects/osimages/internal/metal3"
)

// metal3Discovery gives the check a watch on each Metal3 kind as soon as
// the apiserver serves it, so that a capm3 installed after the controller
// started needs no restart: while a kind is missing, it looks again every
// interval, as the image server's reference tracker does.
type metal3Discovery struct {
	check    *checkReconciler
	ctrl     controller.Controller
	mapper   meta.RESTMapper
	cache    cache.Cache
	interval time.Duration
}

// Start looks for the missing kinds until all are watched, or ctx ends.
// It makes metal3Discovery a manager.Runnable, elected with the check.
func (d *metal3Discovery) Start(ctx context.Context) error {
	log := d.check.log
	tick := time.NewTicker(d.interval)
	defer tick.Stop()
	for !d.complete() {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		before := len(d.watched())
		if err := d.discover(); err != nil {
			log.Error(err, "cannot tell whether the Metal3 API is served; looking again", "in", d.interval.String())
			continue
		}
		if len(d.watched()) > before {
			log.Info("the Metal3 API is served now: the check reads the Metal3 objects too", "watched", d.watched())
		}
	}
	return nil
}

// discover watches the kinds served that are not watched yet.
func (d *metal3Discovery) discover() error {
	served, err := metal3.ServedKinds(d.mapper)
	if err != nil {
		return err
	}
	for _, gvk := range served {
		if slices.Contains(d.watched(), gvk.Kind) {
			continue
		}
		// Listed before the watch starts: a reconcile caused by the
		// watch's first events reads the new kind.
		d.check.mu.Lock()
		d.check.metal3 = append(d.check.metal3, gvk)
		d.check.mu.Unlock()
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(gvk)
		if err := d.ctrl.Watch(source.Kind[client.Object](d.cache, u, handler.EnqueueRequestsFromMapFunc(toNamespace))); err != nil {
			d.check.mu.Lock()
			d.check.metal3 = slices.DeleteFunc(d.check.metal3, func(k schema.GroupVersionKind) bool { return k == gvk })
			d.check.mu.Unlock()
			return err
		}
	}
	return nil
}

// watched names the kinds watched.
func (d *metal3Discovery) watched() []string {
	var out []string
	for _, gvk := range d.check.metal3Kinds() {
		out = append(out, gvk.Kind)
	}
	return out
}

func (d *metal3Discovery) complete() bool { return len(d.watched()) == len(metal3.Kinds) }
