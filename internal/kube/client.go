package kube

import (
	"context"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	coordinationv1 "k8s.io/client-go/kubernetes/typed/coordination/v1"
	corev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	discoveryv1 "k8s.io/client-go/kubernetes/typed/discovery/v1"
	eventsv1 "k8s.io/client-go/kubernetes/typed/events/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/flowcontrol"
)

// Client is the part of the Kubernetes API that osimages' typed clients
// use: ConfigMaps, Events, Leases and EndpointSlices. kubernetes.Interface
// has it (the tests pass envtest's clientset).
//
// Production code builds it with NewClient, never with
// kubernetes.NewForConfig, nor through client-go's SharedInformerFactory
// (see NewInformer): either one links the typed client, apply
// configurations, informer and lister of every API group (18 MB of the production
// binary, 4 MiB of every process's idle RSS, whatever its command).
// TestBinaryHasNoFullClientset (cmd/osimages) holds it.
type Client interface {
	CoreV1() corev1.CoreV1Interface
	CoordinationV1() coordinationv1.CoordinationV1Interface
	DiscoveryV1() discoveryv1.DiscoveryV1Interface
	EventsV1() eventsv1.EventsV1Interface
}

type groupClients struct {
	core         *corev1.CoreV1Client
	coordination *coordinationv1.CoordinationV1Client
	discovery    *discoveryv1.DiscoveryV1Client
	events       *eventsv1.EventsV1Client
}

func (c *groupClients) CoreV1() corev1.CoreV1Interface { return c.core }
func (c *groupClients) CoordinationV1() coordinationv1.CoordinationV1Interface {
	return c.coordination
}
func (c *groupClients) DiscoveryV1() discoveryv1.DiscoveryV1Interface { return c.discovery }
func (c *groupClients) EventsV1() eventsv1.EventsV1Interface          { return c.events }

// NewClient builds the group clients of Client as kubernetes.NewForConfig
// builds them: one HTTP client and one rate limiter shared by all.
func NewClient(cfg *rest.Config) (Client, error) {
	shallow := *cfg
	if shallow.RateLimiter == nil && shallow.QPS > 0 {
		if shallow.Burst <= 0 {
			return nil, fmt.Errorf("burst is required to be greater than 0 when RateLimiter is not set and QPS is set to greater than 0")
		}
		shallow.RateLimiter = flowcontrol.NewTokenBucketRateLimiter(shallow.QPS, shallow.Burst)
	}
	hc, err := rest.HTTPClientFor(&shallow)
	if err != nil {
		return nil, err
	}
	var c groupClients
	if c.core, err = corev1.NewForConfigAndClient(&shallow, hc); err != nil {
		return nil, err
	}
	if c.coordination, err = coordinationv1.NewForConfigAndClient(&shallow, hc); err != nil {
		return nil, err
	}
	if c.discovery, err = discoveryv1.NewForConfigAndClient(&shallow, hc); err != nil {
		return nil, err
	}
	if c.events, err = eventsv1.NewForConfigAndClient(&shallow, hc); err != nil {
		return nil, err
	}
	return &c, nil
}

// Lister lists and watches one kind of object in one namespace, as a
// typed client's List and Watch do.
type Lister[L runtime.Object] interface {
	List(ctx context.Context, opts metav1.ListOptions) (L, error)
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
}

// NewInformer is an informer on the objects of l, each listed and watched
// with the options that tweak sets, built as client-go's generated
// informers build theirs (informers.NewSharedInformerFactory would link
// every API group's; see Client). Run it with RunWithContext.
func NewInformer[L runtime.Object](client Client, l Lister[L], object runtime.Object, resync time.Duration, tweak func(*metav1.ListOptions)) cache.SharedIndexInformer {
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			tweak(&opts)
			return l.List(ctx, opts)
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			tweak(&opts)
			return l.Watch(ctx, opts)
		},
	}
	return cache.NewSharedIndexInformerWithOptions(cache.ToListWatcherWithWatchListSemantics(lw, client), object,
		cache.SharedIndexInformerOptions{ResyncPeriod: resync})
}
