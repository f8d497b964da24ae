package kube

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"

	"github.com/go-logr/logr"
	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/sylva-projects/osimages/internal/clip"
)

// ManagerFlags are the flags of every command that runs a
// controller-runtime manager (controller, propagate): cluster access and
// its rate, leader election, endpoints and logs. One set, so that the
// commands cannot drift apart.
type ManagerFlags struct {
	Kubeconfig              string
	LeaderElect             bool
	LeaderElectionNamespace string
	MetricsAddr, HealthAddr string
	QPS                     float32
	Burst                   int
	LogFormat               string
	Verbosity               int
}

// AddFlags adds the flags; leaseNamespace is the default namespace of the
// leader-election Lease.
func (m *ManagerFlags) AddFlags(f *pflag.FlagSet, leaseNamespace string) {
	f.StringVar(&m.Kubeconfig, "kubeconfig", "", "kubeconfig file (default $KUBECONFIG, ~/.kube/config or in-cluster)")
	f.BoolVar(&m.LeaderElect, "leader-elect", false, "run as one of several replicas: only the holder of the Lease writes")
	f.StringVar(&m.LeaderElectionNamespace, "leader-election-namespace", leaseNamespace, "namespace of the leader-election Lease")
	f.StringVar(&m.MetricsAddr, "metrics-addr", ":8080", "listen address of the Prometheus /metrics endpoint (0 disables)")
	f.StringVar(&m.HealthAddr, "health-addr", ":8081", "listen address of /healthz and /readyz (0 disables)")
	// A source change writes every copy at once: the burst lets a fan-out
	// of up to 500 copies go unthrottled, the rate still bounds a runaway
	// loop, and the apiserver's priority and fairness applies on top.
	f.Float32Var(&m.QPS, "kube-api-qps", 200, "sustained requests per second to the apiserver")
	f.IntVar(&m.Burst, "kube-api-burst", 500, "requests to the apiserver in a burst")
	f.StringVar(&m.LogFormat, "log-format", "json", "log format: json or text")
	f.IntVarP(&m.Verbosity, "verbosity", "v", 0, "log verbosity: 0 writes and problems, 1 also writes retried because the cache was behind")
}

// Validate checks the flags that can be wrong without a cluster.
func (m ManagerFlags) Validate() error {
	if m.QPS <= 0 || m.Burst < 1 {
		return fmt.Errorf("--kube-api-qps %v and --kube-api-burst %d: must be positive", m.QPS, m.Burst)
	}
	if err := ValidateNamespace(m.LeaderElectionNamespace); err != nil {
		return fmt.Errorf("--leader-election-namespace: %w", err)
	}
	for flag, addr := range map[string]string{"--metrics-addr": m.MetricsAddr, "--health-addr": m.HealthAddr} {
		if addr == "0" {
			continue
		}
		if err := ValidateListenAddress(addr); err != nil {
			return fmt.Errorf("%s: %w, or 0 to disable it", flag, err)
		}
	}
	_, err := NewLogger(io.Discard, m.LogFormat, m.Verbosity)
	return err
}

// ValidateListenAddress refuses what cannot be listened on: it wants
// [HOST]:PORT, the port a number.
func ValidateListenAddress(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err == nil {
		var n uint64
		if n, err = strconv.ParseUint(port, 10, 16); err == nil && n > 65535 {
			err = errors.New("port out of range")
		}
	}
	if err != nil {
		return fmt.Errorf("listen address %q: want [HOST]:PORT, such as :8080 or 127.0.0.1:8080 (%v)", addr, err)
	}
	return nil
}

// Setup returns the REST config (with the flags' rate) and the manager
// options, logging to w; leaderID names the Lease. controller-runtime and
// client-go (leader election) log through their own globals: they are sent
// to the same structured log.
func (m ManagerFlags) Setup(w io.Writer, leaderID string) (*rest.Config, ManagerOptions, error) {
	if err := m.Validate(); err != nil {
		return nil, ManagerOptions{}, err
	}
	logger, err := NewLogger(w, m.LogFormat, m.Verbosity)
	if err != nil {
		return nil, ManagerOptions{}, err
	}
	cfg, err := RESTConfig(m.Kubeconfig)
	if err != nil {
		return nil, ManagerOptions{}, err
	}
	cfg.QPS, cfg.Burst = m.QPS, m.Burst
	ctrllog.SetLogger(logger)
	klog.SetLogger(logger)
	return cfg, ManagerOptions{
		LeaderElection:          m.LeaderElect,
		LeaderElectionNamespace: m.LeaderElectionNamespace,
		LeaderElectionID:        leaderID,
		MetricsAddr:             m.MetricsAddr,
		HealthAddr:              m.HealthAddr,
		Logger:                  logger,
	}, nil
}

// NewLogger returns the structured log of --log-format and --verbosity,
// each value clipped (clip.LogValue): errors quote tenant values and
// registry answers.
func NewLogger(w io.Writer, format string, verbosity int) (logr.Logger, error) {
	// logr's V(n) is slog level -n.
	opts := &slog.HandlerOptions{Level: slog.Level(-verbosity)}
	switch format {
	case "json":
		return logr.FromSlogHandler(clip.Handler(slog.NewJSONHandler(w, opts), clip.LogValue)), nil
	case "text":
		return logr.FromSlogHandler(clip.Handler(slog.NewTextHandler(w, opts), clip.LogValue)), nil
	}
	return logr.Logger{}, fmt.Errorf("--log-format %q: want json or text", format)
}

// Quantity reads the value of flag as a Kubernetes quantity (500Gi); ""
// is 0.
func Quantity(flag, s string) (int64, error) {
	if s == "" {
		return 0, nil
	}
	q, err := resource.ParseQuantity(s)
	if err != nil {
		return 0, fmt.Errorf("%s %q: want a quantity such as 500Gi: %w", flag, s, err)
	}
	return q.Value(), nil
}
