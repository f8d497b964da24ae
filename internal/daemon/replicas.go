package daemon

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"

	"github.com/sylva-projects/osimages/internal/kube"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/replica"
	"github.com/sylva-projects/osimages/internal/server"
)

// Defaults of the replica flags.
const (
	DefaultPeerListen     = ":8081"
	DefaultPublisherLease = "osimages-server-publisher"
)

// replicas is what a server behind a headless Service runs besides the
// rest: the EndpointSlice tracker, the peer listener and the publisher's
// election.
type replicas struct {
	log       *slog.Logger
	client    kube.Client
	namespace string
	id, lease string
	tracker   *replica.Tracker
	ln        net.Listener
	srv       *server.Server
	httpSrv   *http.Server
	// pod is this replica's Pod ($POD_NAME), which events about peers
	// are recorded on; without it none are.
	pod         string
	broadcaster events.EventBroadcaster
	recorder    events.EventRecorder
}

func openReplicas(o Options, log *slog.Logger) (*replicas, error) {
	if o.OutputFile != "" || o.PeerListener == nil || o.ReplicaID == "" {
		return nil, errors.New("replicas need a peer listener and a replica ID, and publish no file (they publish one ConfigMap, through an elected leader)")
	}
	ns, err := namespace(o)
	if err != nil {
		return nil, err
	}
	client, err := kube.Clientset(o.Kubeconfig)
	if err != nil {
		return nil, err
	}
	lease := o.PublisherLease
	if lease == "" {
		lease = DefaultPublisherLease
	}
	r := &replicas{log: log, client: client, namespace: ns, id: o.ReplicaID, lease: lease, ln: o.PeerListener,
		tracker: replica.NewTracker(client, ns, o.PeersService, o.ReplicaID), pod: os.Getenv("POD_NAME")}
	if r.pod != "" {
		r.broadcaster = events.NewBroadcaster(&events.EventSinkImpl{Interface: client.EventsV1()})
		r.recorder = kube.BoundedEvents(r.broadcaster.NewRecorder(scheme.Scheme, "osimages-server"))
	}
	return r, nil
}

// reportPeer records a Warning event on this replica's Pod about a peer
// that failed to fill an image.
func (r *replicas) reportPeer(peer string, sha256 osimage.SHA256, reason string) {
	if r.recorder == nil {
		return
	}
	pod := &corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: r.namespace, Name: r.pod}
	r.recorder.Eventf(pod, nil, corev1.EventTypeWarning, "PeerFillFailed", "FillImage", "peer %s failed to fill image %s, filled from elsewhere: %s", peer, sha256, reason)
}

// namespace is the server's own: $POD_NAMESPACE, else the pod's service
// account namespace, else that of the output ConfigMap.
func namespace(o Options) (string, error) {
	if ns := os.Getenv("POD_NAMESPACE"); ns != "" {
		return ns, nil
	}
	if b, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace"); err == nil && strings.TrimSpace(string(b)) != "" {
		return strings.TrimSpace(string(b)), nil
	}
	if o.OutputConfigMap == nil {
		return "", errors.New("the server's namespace is unknown: POD_NAMESPACE is not set, there is no service account namespace, and no output ConfigMap names one")
	}
	return o.OutputConfigMap.Namespace, nil
}

func (r *replicas) run(ctx context.Context, g *errgroup.Group) {
	r.httpSrv = r.srv.PeerHTTPServer()
	r.log.Info("serving peers", "replica", r.id, "address", r.ln.Addr().String(), "namespace", r.namespace, "lease", r.lease)
	g.Go(func() error { r.tracker.Run(ctx); return nil })
	if r.broadcaster != nil {
		if err := r.broadcaster.StartRecordingToSinkWithContext(ctx); err != nil {
			r.log.Error("events about peers are not recorded", "error", err)
		}
		g.Go(func() error { <-ctx.Done(); r.broadcaster.Shutdown(); return nil })
	}
	g.Go(func() error {
		if err := r.httpSrv.Serve(r.ln); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})
	g.Go(func() error {
		<-ctx.Done()
		// Peers following a download of this replica resume elsewhere.
		return r.httpSrv.Close()
	})
	g.Go(func() error { return replica.Elect(ctx, r.client, r.namespace, r.lease, r.id, r.srv.SetLeader) })
}
