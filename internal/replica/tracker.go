package replica

import (
	"github.com/sylva-projects/osimages/internal/kube"

	"cmp"
	"context"
	"net"
	"slices"
	"strconv"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
)

// PortName is the name of the EndpointSlice port that replicas reach each
// other on (--peer-listen); the clients' port is named "http".
const PortName = "peer"

// Peer is one ready replica as its EndpointSlice names it.
type Peer struct {
	// ID is the replica's ID: the endpoint's targetRef name (the pod), or
	// its hostname.
	ID string
	// URL is the base URL of its peer port, such as http://10.0.0.5:8081.
	URL string
}

// Tracker follows the ready endpoints of a headless Service through its
// EndpointSlices (discovery.k8s.io/v1, labelled
// kubernetes.io/service-name), with a client-go informer. It needs list
// and watch on endpointslices in the namespace.
type Tracker struct {
	self     string
	informer cache.SharedIndexInformer
}

// NewTracker follows the Service service of namespace; self is this
// replica's ID, left out of Ready.
func NewTracker(client kube.Client, namespace, service, self string) *Tracker {
	informer := kube.NewInformer(client, client.DiscoveryV1().EndpointSlices(namespace), &discoveryv1.EndpointSlice{}, 10*time.Minute,
		func(o *metav1.ListOptions) { o.LabelSelector = discoveryv1.LabelServiceName + "=" + service })
	return &Tracker{self: self, informer: informer}
}

// Run follows the EndpointSlices until ctx ends.
func (t *Tracker) Run(ctx context.Context) {
	t.informer.RunWithContext(ctx)
}

// Synced says whether the EndpointSlices were listed once.
func (t *Tracker) Synced() bool { return t.informer.HasSynced() }

// Self is this replica's ID.
func (t *Tracker) Self() string { return t.self }

// Ready returns the ready replicas other than this one, by ID.
func (t *Tracker) Ready() []Peer {
	ready, _ := ReadyEndpoints(t.endpointSlices(), t.self)
	return ready
}

func (t *Tracker) endpointSlices() []*discoveryv1.EndpointSlice {
	var all []*discoveryv1.EndpointSlice
	for _, o := range t.informer.GetStore().List() {
		if s, ok := o.(*discoveryv1.EndpointSlice); ok {
			all = append(all, s)
		}
	}
	return all
}

// Listed returns the other replicas the EndpointSlices list, ready or not
// (terminating ones left out).
func (t *Tracker) Listed() []Peer {
	var all []*discoveryv1.EndpointSlice
	for _, s := range t.endpointSlices() {
		s = s.DeepCopy()
		for i := range s.Endpoints {
			s.Endpoints[i].Conditions.Ready = nil
		}
		all = append(all, s)
	}
	listed, _ := ReadyEndpoints(all, t.self)
	return listed
}

// SelfReady says whether this replica is among the ready endpoints.
func (t *Tracker) SelfReady() bool {
	_, self := ReadyEndpoints(t.endpointSlices(), t.self)
	return self
}

// ReadyEndpoints reads the ready endpoints of slices: the peers other than
// self, by ID (one per ID, the first address), and whether self is ready.
// An endpoint without a ready condition counts as ready, as the API says;
// one terminating or without a port named "peer" is left out.
func ReadyEndpoints(all []*discoveryv1.EndpointSlice, self string) (peers []Peer, selfReady bool) {
	seen := map[string]bool{}
	for _, s := range all {
		port := int32(-1)
		for _, p := range s.Ports {
			if p.Name != nil && *p.Name == PortName && p.Port != nil {
				port = *p.Port
			}
		}
		for _, e := range s.Endpoints {
			if e.Conditions.Ready != nil && !*e.Conditions.Ready || e.Conditions.Terminating != nil && *e.Conditions.Terminating {
				continue
			}
			id := ""
			switch {
			case e.TargetRef != nil && e.TargetRef.Name != "":
				id = e.TargetRef.Name
			case e.Hostname != nil:
				id = *e.Hostname
			}
			if id == "" || seen[id] {
				continue
			}
			if id == self {
				selfReady = true
				continue
			}
			if port < 0 || len(e.Addresses) == 0 {
				continue
			}
			seen[id] = true
			peers = append(peers, Peer{ID: id, URL: "http://" + net.JoinHostPort(e.Addresses[0], strconv.Itoa(int(port)))})
		}
	}
	slices.SortFunc(peers, func(a, b Peer) int { return cmp.Compare(a.ID, b.ID) })
	return peers, selfReady
}
