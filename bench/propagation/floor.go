package main

import (
	"context"
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/propagate"
	"github.com/sylva-projects/osimages/internal/testenv"
)

// floorSystem is the least any copier has to do: it writes, in-process,
// exactly the copies the bench expects (with marks of the same size as
// osimages' labels and annotations) and nothing else: no list of the
// catalogs, no read before a write, no event. It runs no process, so only
// the apiserver's and etcd's figures mean something; they are what the
// copies themselves cost the apiserver, which osimages' figures are then
// compared with.
func floorSystem(c config) system {
	return system{name: "writes alone", start: func(ctx context.Context, k *testenv.Kube, _ string) ([]*proc, error) {
		cfg := rest.CopyConfig(k.Config)
		cfg.QPS, cfg.Burst = 1000, 2000
		cs, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			return nil, err
		}
		f := &floor{c: c, client: cs, written: map[string]*corev1.ConfigMap{}}
		return nil, f.start(ctx)
	}}
}

type floor struct {
	c      config
	client kubernetes.Interface

	mu      sync.Mutex
	source  osimage.ServedSet // nil until the source is read
	written map[string]*corev1.ConfigMap
}

func (f *floor) start(ctx context.Context) error {
	queue := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]())
	go func() {
		<-ctx.Done()
		queue.ShutDown()
	}()
	namespaces := informers.NewSharedInformerFactoryWithOptions(f.client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.LabelSelector = labels.Set{propagate.WorkloadClusterLabel: ""}.String()
		})).Core().V1().Namespaces().Informer()
	sources := informers.NewSharedInformerFactoryWithOptions(f.client, 0,
		informers.WithNamespace(osimage.ServedConfigMapNamespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", osimage.ServedConfigMapName).String()
		})).Core().V1().ConfigMaps().Informer()
	if _, err := namespaces.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if ns, ok := obj.(*corev1.Namespace); ok {
				queue.Add(ns.Name)
			}
		},
	}); err != nil {
		return err
	}
	onSource := func(obj any) {
		cm, ok := obj.(*corev1.ConfigMap)
		if !ok {
			return
		}
		set, err := osimage.ParseServed([]byte(cm.Data[osimage.ValuesKey]))
		if err != nil {
			fmt.Printf("writes alone: the source does not parse: %v\n", err)
			return
		}
		f.mu.Lock()
		f.source = set
		f.mu.Unlock()
		for _, name := range namespaces.GetStore().ListKeys() {
			queue.Add(name)
		}
	}
	if _, err := sources.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    onSource,
		UpdateFunc: func(_, obj any) { onSource(obj) },
	}); err != nil {
		return err
	}
	go namespaces.RunWithContext(ctx)
	go sources.RunWithContext(ctx)
	if !toolscache.WaitForCacheSync(ctx.Done(), namespaces.HasSynced, sources.HasSynced) {
		return fmt.Errorf("writes alone: informers did not sync")
	}
	for range 8 { // osimages propagate's --workers default
		go func() {
			for {
				ns, quit := queue.Get()
				if quit {
					return
				}
				if err := f.write(ctx, ns); err != nil && ctx.Err() == nil {
					queue.AddRateLimited(ns)
				} else {
					queue.Forget(ns)
				}
				queue.Done(ns)
			}
		}()
	}
	return nil
}

// write creates or updates the copy of namespace ns, from the object it
// last wrote there: no read.
func (f *floor) write(ctx context.Context, ns string) error {
	var i int
	if _, err := fmt.Sscanf(ns, "wc-%d", &i); err != nil {
		return nil // not one of the bench's namespaces
	}
	f.mu.Lock()
	set, last := f.source, f.written[ns]
	f.mu.Unlock()
	if set == nil {
		return nil
	}
	doc := filteredValues(f.c, set, i)
	if last != nil && last.Data[osimage.ValuesKey] == doc {
		return nil
	}
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: ns, Name: propagate.DefaultTargetName,
			Labels: map[string]string{
				propagate.LabelRule:            "os-image-server",
				propagate.LabelSourceNamespace: osimage.ServedConfigMapNamespace,
				propagate.LabelSourceName:      osimage.ServedConfigMapName,
			},
			Annotations: map[string]string{
				propagate.AnnotationSourceHash: hashOf(doc),
				propagate.AnnotationOwnerProof: "hmac-sha256:" + hashOf(ns),
				propagate.AnnotationPicks: fmt.Sprintf("%d sha256s named by ConfigMap %s, 0 needed by osimages-status; %d served entries kept",
					f.c.catalogImages, osimage.InfoConfigMapName, f.c.catalogImages-1),
			},
		},
		Data: map[string]string{osimage.ValuesKey: doc},
	}
	cms := f.client.CoreV1().ConfigMaps(ns)
	var out *corev1.ConfigMap
	var err error
	if last == nil {
		out, err = cms.Create(ctx, cm, metav1.CreateOptions{FieldManager: "osimages"})
		if apierrors.IsAlreadyExists(err) {
			if last, err = cms.Get(ctx, cm.Name, metav1.GetOptions{}); err != nil {
				return err
			}
		}
	}
	if last != nil {
		cm.ResourceVersion = last.ResourceVersion
		out, err = cms.Update(ctx, cm, metav1.UpdateOptions{FieldManager: "osimages"})
	}
	if err != nil {
		return err
	}
	f.mu.Lock()
	f.written[ns] = out
	f.mu.Unlock()
	return nil
}
