package replica

import (
	"github.com/sylva-projects/osimages/internal/kube"

	"context"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// The Lease's timing, as controller-runtime's defaults: a leader that
// dies is replaced within LeaseDuration; one that stops on SIGTERM
// releases the Lease at once.
var (
	leaseDuration = 15 * time.Second
	renewDeadline = 10 * time.Second
	retryPeriod   = 2 * time.Second
)

// Elect campaigns for the Lease namespace/name as id until ctx ends, again
// after each loss, and tells lead whether this replica holds it: the
// holder publishes the served set.
func Elect(ctx context.Context, client kube.Client, namespace, name, id string, lead func(bool)) error {
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: namespace, Name: name},
		Client:     client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: id},
	}
	for ctx.Err() == nil {
		le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock: lock, ReleaseOnCancel: true, Name: name,
			LeaseDuration: leaseDuration, RenewDeadline: renewDeadline, RetryPeriod: retryPeriod,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(context.Context) { lead(true) },
				OnStoppedLeading: func() { lead(false) },
			},
		})
		if err != nil {
			return err
		}
		le.Run(ctx)
	}
	return nil
}
