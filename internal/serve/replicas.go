package serve

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/sylva-projects/osimages/internal/kube"
	"github.com/sylva-projects/osimages/internal/peers"
	"github.com/sylva-projects/osimages/internal/server"
)

// Defaults of the replica flags.
const (
	DefaultPeerListen     = ":8081"
	DefaultPublisherLease = "osimages-server-publisher"
)

// The Lease's timing, as controller-runtime's defaults: a leader that
// dies is replaced within LeaseDuration; one that stops on SIGTERM
// releases the Lease at once.
var (
	leaseDuration = 15 * time.Second
	renewDeadline = 10 * time.Second
	retryPeriod   = 2 * time.Second
)

// replicas is what a server behind a headless Service runs besides the
// rest: the EndpointSlice tracker, the peer listener and the publisher's
// election.
type replicas struct {
	log       *slog.Logger
	client    kubernetes.Interface
	namespace string
	id, lease string
	tracker   *peers.Tracker
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
	if o.OutputFile != "" {
		return nil, errors.New("--peers-service needs --output-configmap: replicas publish one ConfigMap through an elected leader, not a file each")
	}
	if o.PeerTimeout <= 0 {
		return nil, fmt.Errorf("--peer-timeout %s: give a positive duration, such as 30s", o.PeerTimeout)
	}
	id := o.ReplicaID
	if id == "" {
		id = os.Getenv("POD_NAME")
	}
	if id == "" {
		h, err := os.Hostname()
		if err != nil {
			return nil, fmt.Errorf("--replica-id is empty, POD_NAME is not set and the hostname cannot be read (%v): give --replica-id", err)
		}
		id = h
	}
	ns, err := namespace(o)
	if err != nil {
		return nil, err
	}
	client, err := kube.Clientset(o.Kubeconfig)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", o.PeerListen)
	if err != nil {
		return nil, fmt.Errorf("--peer-listen %s: %w", o.PeerListen, err)
	}
	lease := o.PublisherLease
	if lease == "" {
		lease = DefaultPublisherLease
	}
	r := &replicas{log: log, client: client, namespace: ns, id: id, lease: lease, ln: ln,
		tracker: peers.NewTracker(client, ns, o.PeersService, id), pod: os.Getenv("POD_NAME")}
	if r.pod != "" {
		r.broadcaster = events.NewBroadcaster(&events.EventSinkImpl{Interface: client.EventsV1()})
		r.recorder = kube.BoundedEvents(r.broadcaster.NewRecorder(scheme.Scheme, "osimages-server"))
	}
	return r, nil
}

// reportPeer records a Warning event on this replica's Pod about a peer
// that failed to fill an image.
func (r *replicas) reportPeer(peer, sha256, reason string) {
	if r.recorder == nil {
		return
	}
	pod := &corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: r.namespace, Name: r.pod}
	r.recorder.Eventf(pod, nil, corev1.EventTypeWarning, "PeerFillFailed", "FillImage", "peer %s failed to fill image %s, filled from elsewhere: %s", peer, sha256, reason)
}

// namespace is the server's own: $POD_NAMESPACE, else the pod's service
// account namespace, else that of --output-configmap.
func namespace(o Options) (string, error) {
	if ns := os.Getenv("POD_NAMESPACE"); ns != "" {
		return ns, nil
	}
	if b, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace"); err == nil && strings.TrimSpace(string(b)) != "" {
		return strings.TrimSpace(string(b)), nil
	}
	key, err := kube.ParseObjectKey(o.OutputConfigMap)
	if err != nil {
		return "", fmt.Errorf("--output-configmap %w", err)
	}
	return key.Namespace, nil
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
	g.Go(func() error { return r.elect(ctx) })
}

// elect campaigns for the publisher's Lease until ctx ends, again after
// each loss.
func (r *replicas) elect(ctx context.Context) error {
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: r.namespace, Name: r.lease},
		Client:     r.client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: r.id},
	}
	for ctx.Err() == nil {
		le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock: lock, ReleaseOnCancel: true, Name: r.lease,
			LeaseDuration: leaseDuration, RenewDeadline: renewDeadline, RetryPeriod: retryPeriod,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(context.Context) { r.srv.SetLeader(true) },
				OnStoppedLeading: func() { r.srv.SetLeader(false) },
			},
		})
		if err != nil {
			return err
		}
		le.Run(ctx)
	}
	return nil
}
