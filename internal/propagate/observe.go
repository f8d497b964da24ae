package propagate

import (
	"context"
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sylva-projects/osimages/internal/osimage"
)

// observer reads what Decide needs from the informer cache. The documents
// a rule with a Catalog reads (the source, each namespace's catalog and
// status) are parsed once per version: a source change reconciles every
// namespace, and the metrics run Decide over all of them at each scrape.
type observer struct {
	reader   client.Reader
	sources  parsed[ServedSource]
	catalogs parsed[catalogRead]
	statuses parsed[map[osimage.SHA256]bool]
}

type catalogRead struct {
	sha256s map[osimage.SHA256]bool
	err     error
}

func newObserver(reader client.Reader) *observer {
	return &observer{reader: reader}
}

// observe reads the state of rule r in namespace.
func (ob *observer) observe(ctx context.Context, r Rule, namespace string) (Observed, error) {
	var o Observed
	ns := &corev1.Namespace{}
	if found, err := get(ctx, ob.reader, types.NamespacedName{Name: namespace}, ns); err != nil {
		return o, fmt.Errorf("reading namespace %s: %w", namespace, err)
	} else if found {
		o.Namespace = ns
	}
	src := &corev1.ConfigMap{}
	srcKey := types.NamespacedName{Namespace: r.Source.Namespace, Name: r.Source.Name}
	if found, err := get(ctx, ob.reader, srcKey, src); err != nil {
		return o, fmt.Errorf("reading source ConfigMap %s: %w", r.Source, err)
	} else if found {
		o.Source = src
	}
	cp := &corev1.ConfigMap{}
	if found, err := get(ctx, ob.reader, types.NamespacedName{Namespace: namespace, Name: r.Target}, cp); err != nil {
		return o, fmt.Errorf("reading ConfigMap %s/%s: %w", namespace, r.Target, err)
	} else if found {
		o.Copy = cp
	}
	// Decide reads the picks only where the rule makes a copy.
	if r.Catalog == "" || o.Namespace == nil || !r.Selector.Matches(labels.Set(o.Namespace.Labels)) {
		return o, nil
	}
	if o.Source != nil {
		s := ob.sources.get(srcKey, o.Source, ReadServedSource)
		o.Served = &s
	}
	var err error
	o.Picks, err = ob.picks(ctx, r.Catalog, namespace)
	return o, err
}

// picks reads what namespace can use of a served set.
func (ob *observer) picks(ctx context.Context, catalogName, namespace string) (Picks, error) {
	var catalog catalogRead
	key := types.NamespacedName{Namespace: namespace, Name: catalogName}
	cm := &corev1.ConfigMap{}
	catalogFound, err := get(ctx, ob.reader, key, cm)
	if err != nil {
		return Picks{}, fmt.Errorf("reading ConfigMap %s: %w", key, err)
	}
	if catalogFound {
		catalog = ob.catalogs.get(key, cm, func(cm *corev1.ConfigMap) catalogRead {
			s, err := CatalogSHA256s(cm)
			return catalogRead{sha256s: s, err: err}
		})
	} else {
		ob.catalogs.forget(key)
	}
	var needed map[osimage.SHA256]bool
	key = types.NamespacedName{Namespace: namespace, Name: osimage.StatusConfigMapName}
	status := &corev1.ConfigMap{}
	if found, err := get(ctx, ob.reader, key, status); err != nil {
		return Picks{}, fmt.Errorf("reading ConfigMap %s: %w", key, err)
	} else if found {
		needed = ob.statuses.get(key, status, StatusSHA256s)
	} else {
		ob.statuses.forget(key)
	}
	return NewPicks(catalogName, catalog.sha256s, catalogFound, catalog.err, needed), nil
}

// parsed keeps what was read of each ConfigMap, by name, for the version
// it was read from.
type parsed[T any] struct {
	mu sync.Mutex
	m  map[types.NamespacedName]parsedEntry[T]
}

type parsedEntry[T any] struct {
	uid, version string
	value        T
}

// get returns read(cm), from memory when cm is the version last read.
func (p *parsed[T]) get(key types.NamespacedName, cm *corev1.ConfigMap, read func(*corev1.ConfigMap) T) T {
	p.mu.Lock()
	e, ok := p.m[key]
	p.mu.Unlock()
	// Without a resourceVersion (an object not from the apiserver) there
	// is nothing to tell versions apart by.
	if ok && cm.ResourceVersion != "" && e.uid == string(cm.UID) && e.version == cm.ResourceVersion {
		return e.value
	}
	v := read(cm)
	p.mu.Lock()
	if p.m == nil {
		p.m = map[types.NamespacedName]parsedEntry[T]{}
	}
	p.m[key] = parsedEntry[T]{uid: string(cm.UID), version: cm.ResourceVersion, value: v}
	p.mu.Unlock()
	return v
}

func (p *parsed[T]) forget(key types.NamespacedName) {
	p.mu.Lock()
	delete(p.m, key)
	p.mu.Unlock()
}
