package kube

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
)

// ManagerOptions are the settings shared by every controller-runtime
// manager osimages runs (propagate, controller): leader election, the
// metrics and health endpoints, and the log.
type ManagerOptions struct {
	LeaderElection          bool
	LeaderElectionNamespace string
	// LeaderElectionID names the Lease; each command has its default.
	LeaderElectionID string
	// LeaseDuration, RenewDeadline and RetryPeriod tune the election
	// (controller-runtime's defaults when zero: 15s, 10s, 2s).
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration

	// MetricsAddr and HealthAddr are listen addresses; "0" or "" disables.
	MetricsAddr, HealthAddr string

	Logger logr.Logger
}

// HealthEnabled says whether /healthz and /readyz are served.
func (o ManagerOptions) HealthEnabled() bool { return o.HealthAddr != "" && o.HealthAddr != "0" }

// NewManager builds a manager with these options and the given cache
// options. defaultID names the Lease when LeaderElectionID is empty. A
// stopping replica releases the Lease, so that another takes over at once.
// When HealthEnabled, /healthz answers while the process runs, and /readyz
// once every informer of the cache synced.
func (o ManagerOptions) NewManager(cfg *rest.Config, c cache.Options, defaultID string) (manager.Manager, error) {
	id := o.LeaderElectionID
	if id == "" {
		id = defaultID
	}
	metrics, health := o.MetricsAddr, o.HealthAddr
	if metrics == "" {
		metrics = "0"
	}
	if !o.HealthEnabled() {
		health = ""
	}
	nonZero := func(d time.Duration) *time.Duration {
		if d == 0 {
			return nil
		}
		return &d
	}
	mgr, err := manager.New(cfg, manager.Options{
		Logger:                        o.Logger,
		Cache:                         c,
		Metrics:                       metricsserver.Options{BindAddress: metrics},
		HealthProbeBindAddress:        health,
		LeaderElection:                o.LeaderElection,
		LeaderElectionID:              id,
		LeaderElectionNamespace:       o.LeaderElectionNamespace,
		LeaderElectionReleaseOnCancel: true,
		LeaseDuration:                 nonZero(o.LeaseDuration),
		RenewDeadline:                 nonZero(o.RenewDeadline),
		RetryPeriod:                   nonZero(o.RetryPeriod),
	})
	if err != nil {
		return nil, fmt.Errorf("creating the controller manager: %w", err)
	}
	if o.HealthEnabled() {
		synced := func(*http.Request) error {
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			defer cancel()
			if !mgr.GetCache().WaitForCacheSync(ctx) {
				return errors.New("informers not synced yet")
			}
			return nil
		}
		if err := errors.Join(mgr.AddHealthzCheck("ping", healthz.Ping), mgr.AddReadyzCheck("informers", synced)); err != nil {
			return nil, err
		}
	}
	return mgr, nil
}
