package main

import (
	"fmt"
	"io"

	"github.com/go-logr/logr"
	"github.com/spf13/pflag"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/sylva-projects/osimages/internal/kube"
)

// managerFlags are the flags of every command that runs a
// controller-runtime manager (controller, propagate): cluster access and
// its rate, leader election, endpoints and logs. One set, so that the
// commands cannot drift apart.
type managerFlags struct {
	kubeconfig              string
	leaderElect             bool
	leaderElectionNamespace string
	metricsAddr, healthAddr string
	qps                     float32
	burst                   int
	logFormat               string
	verbosity               int
}

// addFlags adds the flags; leaseNamespace is the default namespace of the
// leader-election Lease.
func (m *managerFlags) addFlags(f *pflag.FlagSet, leaseNamespace string) {
	f.StringVar(&m.kubeconfig, "kubeconfig", "", "kubeconfig file (default $KUBECONFIG, ~/.kube/config or in-cluster)")
	f.BoolVar(&m.leaderElect, "leader-elect", false, "run as one of several replicas: only the holder of the Lease writes")
	f.StringVar(&m.leaderElectionNamespace, "leader-election-namespace", leaseNamespace, "namespace of the leader-election Lease")
	f.StringVar(&m.metricsAddr, "metrics-addr", ":8080", "listen address of the Prometheus /metrics endpoint (0 disables)")
	f.StringVar(&m.healthAddr, "health-addr", ":8081", "listen address of /healthz and /readyz (0 disables)")
	// A source change writes every copy at once: the burst lets a fan-out
	// of up to 500 copies go unthrottled, the rate still bounds a runaway
	// loop, and the apiserver's priority and fairness applies on top.
	f.Float32Var(&m.qps, "kube-api-qps", 200, "sustained requests per second to the apiserver")
	f.IntVar(&m.burst, "kube-api-burst", 500, "requests to the apiserver in a burst")
	f.StringVar(&m.logFormat, "log-format", "json", "log format: json or text")
	f.IntVarP(&m.verbosity, "verbosity", "v", 0, "log verbosity: 0 writes and problems, 1 also writes retried because the cache was behind")
}

// validate checks the flags that can be wrong without a cluster.
func (m managerFlags) validate() error {
	if m.qps <= 0 || m.burst < 1 {
		return fmt.Errorf("--kube-api-qps %v and --kube-api-burst %d: must be positive", m.qps, m.burst)
	}
	if err := kube.ValidateNamespace(m.leaderElectionNamespace); err != nil {
		return fmt.Errorf("--leader-election-namespace: %w", err)
	}
	for flag, addr := range map[string]string{"--metrics-addr": m.metricsAddr, "--health-addr": m.healthAddr} {
		if addr == "0" {
			continue
		}
		if err := kube.ValidateListenAddress(addr); err != nil {
			return fmt.Errorf("%s: %w, or 0 to disable it", flag, err)
		}
	}
	_, err := m.logger(io.Discard)
	return err
}

func (m managerFlags) logger(w io.Writer) (logr.Logger, error) {
	logger, err := kube.NewLogger(w, m.logFormat, m.verbosity)
	if err != nil {
		return logr.Logger{}, fmt.Errorf("--log-format %w", err)
	}
	return logger, nil
}

// setup returns the REST config (with the flags' rate) and the manager
// options, logging to w; leaderID names the Lease. controller-runtime and
// client-go (leader election) log through their own globals: they are sent
// to the same structured log.
func (m managerFlags) setup(w io.Writer, leaderID string) (*rest.Config, kube.ManagerOptions, error) {
	if err := m.validate(); err != nil {
		return nil, kube.ManagerOptions{}, err
	}
	logger, err := m.logger(w)
	if err != nil {
		return nil, kube.ManagerOptions{}, err
	}
	cfg, err := kube.RESTConfig(m.kubeconfig)
	if err != nil {
		return nil, kube.ManagerOptions{}, err
	}
	cfg.QPS, cfg.Burst = m.qps, m.burst
	ctrllog.SetLogger(logger)
	klog.SetLogger(logger)
	return cfg, kube.ManagerOptions{
		LeaderElection:          m.leaderElect,
		LeaderElectionNamespace: m.leaderElectionNamespace,
		LeaderElectionID:        leaderID,
		MetricsAddr:             m.metricsAddr,
		HealthAddr:              m.healthAddr,
		Logger:                  logger,
	}, nil
}
