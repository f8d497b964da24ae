package metal3

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"

	"github.com/sylva-projects/osimages/internal/osimage"
)

// References tracks, over the whole cluster, which Metal3 objects
// reference which image sha256, so that the image server never deletes an
// image a machine may still boot from (nodeReuse re-provisions hosts from
// the template long after the image was deselected).
type References struct {
	dyn   dynamic.Interface
	disco discovery.DiscoveryInterface
	log   *slog.Logger

	mu    sync.Mutex
	bySHA map[osimage.SHA256]map[Ref]struct{}
	byRef map[Ref]osimage.SHA256

	synced    atomic.Bool
	informers []cache.SharedIndexInformer // under mu: Synced reads them while start sets them
}

// NewReferences returns a tracker; Run starts it.
func NewReferences(dyn dynamic.Interface, disco discovery.DiscoveryInterface, log *slog.Logger) *References {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &References{dyn: dyn, disco: disco, log: log, bySHA: map[osimage.SHA256]map[Ref]struct{}{}, byRef: map[Ref]osimage.SHA256{}}
}

// Synced says whether every reference in the cluster is known. Until it
// is, nothing may be collected: a reference not seen yet is still a
// reference.
func (r *References) Synced() bool {
	if !r.synced.Load() {
		return false
	}
	r.mu.Lock()
	informers := r.informers
	r.mu.Unlock()
	for _, inf := range informers {
		if !inf.HasSynced() {
			return false
		}
	}
	return true
}

// ReferencedBy returns the objects that reference sha256, sorted.
func (r *References) ReferencedBy(sha256 osimage.SHA256) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	refs := r.bySHA[sha256]
	out := make([]string, 0, len(refs))
	for ref := range refs {
		out = append(out, ref.String())
	}
	slices.Sort(out)
	return out
}

// Run watches the Metal3 objects until ctx ends. When the Metal3 CRDs are
// not installed there can be no reference: the tracker is synced and
// empty, and looks again every interval, since capm3 may be installed
// later.
func (r *References) Run(ctx context.Context, interval time.Duration) {
	for {
		version, err := r.servedVersion()
		switch {
		case err != nil:
			r.log.Error("cannot tell whether the Metal3 API is served; no image is garbage-collected until it can", "error", err)
		case version == "":
			r.log.Info("the Metal3 API (" + Group + ") is not served: no Metal3 object can reference an image")
			r.synced.Store(true)
		default:
			r.start(ctx, version)
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(interval):
		}
	}
}

func (r *References) servedVersion() (string, error) {
	groups, err := r.disco.ServerGroups()
	if err != nil {
		return "", err
	}
	for _, g := range groups.Groups {
		if g.Name == Group {
			return g.PreferredVersion.Version, nil
		}
	}
	return "", nil
}

func (r *References) start(ctx context.Context, version string) {
	factory := dynamicinformer.NewDynamicSharedInformerFactory(r.dyn, 0)
	r.synced.Store(false)
	var informers []cache.SharedIndexInformer
	for resource, kind := range resources {
		gvr := schema.GroupVersionResource{Group: Group, Version: version, Resource: resource}
		inf := factory.ForResource(gvr).Informer()
		// Only the image fields are kept: Metal3Machines are many, and
		// their status is large.
		_ = inf.SetTransform(func(obj any) (any, error) { return SlimObject(obj, kind), nil })
		_ = inf.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
			if apierrors.IsForbidden(err) {
				r.log.Error("listing Metal3 objects is forbidden: grant list and watch on "+gvr.Resource+"; no image is garbage-collected meanwhile", "error", err)
				return
			}
			r.log.Warn("watching Metal3 objects", "resource", gvr.Resource, "error", err)
		})
		_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { r.set(obj) },
			UpdateFunc: func(_, obj any) { r.set(obj) },
			DeleteFunc: func(obj any) { r.remove(obj) },
		})
		informers = append(informers, inf)
	}
	r.mu.Lock()
	r.informers = informers
	r.mu.Unlock()
	r.synced.Store(true)
	factory.Start(ctx.Done())
	r.log.Info("watching Metal3 objects for image references", "version", version)
	<-ctx.Done()
	factory.Shutdown()
}

// SlimObject is a cache transform for Metal3 objects of kind: it keeps
// their name and image fields only, since Metal3Machines are many and
// their status is large.
func SlimObject(obj any, kind string) any {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return obj
	}
	u.SetKind(kind) // list items may come without it
	slim := &unstructured.Unstructured{Object: map[string]any{}}
	slim.SetKind(kind)
	slim.SetNamespace(u.GetNamespace())
	slim.SetName(u.GetName())
	slim.SetResourceVersion(u.GetResourceVersion())
	if img, ok := ImageOf(u); ok {
		fields := map[string]any{"url": img.URL, "checksum": img.Checksum, "checksumType": img.ChecksumType}
		if kind == KindMachineTemplate {
			_ = unstructured.SetNestedMap(slim.Object, fields, "spec", "template", "spec", "image")
		} else {
			_ = unstructured.SetNestedMap(slim.Object, fields, "spec", "image")
		}
	}
	return slim
}

func (r *References) set(obj any) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return
	}
	ref := Ref{Kind: u.GetKind(), Namespace: u.GetNamespace(), Name: u.GetName()}
	var sha osimage.SHA256
	if img, ok := ImageOf(u); ok {
		sha, _ = img.SHA256()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.unlinkLocked(ref)
	if sha == "" {
		return
	}
	r.byRef[ref] = sha
	if r.bySHA[sha] == nil {
		r.bySHA[sha] = map[Ref]struct{}{}
	}
	r.bySHA[sha][ref] = struct{}{}
}

func (r *References) remove(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.unlinkLocked(Ref{Kind: u.GetKind(), Namespace: u.GetNamespace(), Name: u.GetName()})
}

func (r *References) unlinkLocked(ref Ref) {
	old, ok := r.byRef[ref]
	if !ok {
		return
	}
	delete(r.byRef, ref)
	delete(r.bySHA[old], ref)
	if len(r.bySHA[old]) == 0 {
		delete(r.bySHA, old)
	}
}
