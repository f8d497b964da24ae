package main

import (
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/klog/v2"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/sylva-projects/osimages/internal/kube"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/propagate"
)

type propagateOptions struct {
	kubeconfig      string
	config          string
	adopt           bool
	leaderElect     bool
	leaderNamespace string
	resync          time.Duration
	workers         int
	metricsAddr     string
	healthAddr      string
	qps             float32
	burst           int
	logFormat       string
	verbosity       int
}

func newPropagateCommand() *cobra.Command {
	o := propagateOptions{}
	cmd := &cobra.Command{
		Use:   "propagate",
		Short: "Keep a copy of the served-images ConfigMap in every workload-cluster namespace",
		Long: `propagate is a controller: it copies each rule's source ConfigMap into every
namespace its selector matches, and keeps the copies equal to the source
(an edited copy is put back, a deleted one recreated), until stopped.

Without --config, the rule is Sylva's: sylva-system/capm3-os-image-server-os-images
is copied as kyverno-cloned-os-image-server-images into the namespaces labelled
sylva-project.org/workload-cluster="". A rules file reads:

  rules:
  - name: os-image-server-images
    source: sylva-system/capm3-os-image-server-os-images
    target: kyverno-cloned-os-image-server-images
    namespaceSelector:
      matchLabels: {sylva-project.org/workload-cluster: ""}

When the source is deleted the copies are kept and annotated stale; an object
of the target name that osimages did not create is left alone unless --adopt.

Exit codes: 0 stopped by a signal, 1 the controller failed, 2 wrong flags or rules.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runPropagate(cmd, o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.config, "config", "", "rules file (default: Sylva's one rule)")
	f.BoolVar(&o.adopt, "adopt", false, "take over objects of a target name that osimages did not create (such as Kyverno's copies) instead of leaving them alone")
	f.DurationVar(&o.resync, "resync", 10*time.Minute, "check every copy at least this often, events or not")
	f.IntVar(&o.workers, "workers", 8, "copies written at once")
	addManagerFlags(f, &o)
	return cmd
}

func runPropagate(cmd *cobra.Command, o propagateOptions) error {
	if o.workers < 1 {
		return inputError(fmt.Errorf("--workers %d: must be at least 1", o.workers))
	}
	if o.resync <= 0 {
		return inputError(fmt.Errorf("--resync %s: must be positive", o.resync))
	}
	if o.qps <= 0 || o.burst < 1 {
		return inputError(fmt.Errorf("--kube-api-qps %v and --kube-api-burst %d: must be positive", o.qps, o.burst))
	}
	logger, err := newLogger(cmd.ErrOrStderr(), o.logFormat, o.verbosity)
	if err != nil {
		return inputError(err)
	}
	rules := propagate.DefaultRules()
	if o.config != "" {
		if rules, err = propagate.LoadRules(o.config); err != nil {
			return inputError(err)
		}
	}
	cfg, err := kube.RESTConfig(o.kubeconfig)
	if err != nil {
		return inputError(err)
	}
	cfg.QPS, cfg.Burst = o.qps, o.burst

	// controller-runtime and client-go (leader election) log through
	// their own globals; send them to the same structured log.
	ctrllog.SetLogger(logger)
	klog.SetLogger(logger)
	for _, r := range rules {
		logger.Info("rule", "name", r.Name, "source", r.Source.String(), "target", r.Target, "namespaceSelector", r.Selector.String())
	}
	err = propagate.Run(cmd.Context(), cfg, propagate.Options{
		Rules:   rules,
		Adopt:   o.adopt,
		Resync:  o.resync,
		Workers: o.workers,
		ManagerOptions: kube.ManagerOptions{
			LeaderElection:          o.leaderElect,
			LeaderElectionNamespace: o.leaderNamespace,
			MetricsAddr:             o.metricsAddr,
			HealthAddr:              o.healthAddr,
			Logger:                  logger,
		},
	})
	if err != nil {
		return failureError(err)
	}
	return nil
}

// addManagerFlags adds the flags of the commands that run a
// controller-runtime manager: cluster access, leader election, endpoints
// and logs.
func addManagerFlags(f *pflag.FlagSet, o *propagateOptions) {
	f.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file (default $KUBECONFIG, ~/.kube/config or in-cluster)")
	f.BoolVar(&o.leaderElect, "leader-elect", false, "run as one of several replicas: only the holder of the Lease writes")
	f.StringVar(&o.leaderNamespace, "leader-election-namespace", osimage.ServedConfigMapNamespace, "namespace of the leader-election Lease")
	f.StringVar(&o.metricsAddr, "metrics-addr", ":8080", "listen address of the Prometheus /metrics endpoint (0 disables)")
	f.StringVar(&o.healthAddr, "health-addr", ":8081", "listen address of /healthz and /readyz (0 disables)")
	// A source change writes every copy at once: the burst lets a fan-out
	// of up to 500 copies go unthrottled, the rate still bounds a runaway
	// loop, and the apiserver's priority and fairness applies on top.
	f.Float32Var(&o.qps, "kube-api-qps", 200, "sustained requests per second to the apiserver")
	f.IntVar(&o.burst, "kube-api-burst", 500, "requests to the apiserver in a burst")
	f.StringVar(&o.logFormat, "log-format", "json", "log format: json or text")
	f.IntVarP(&o.verbosity, "verbosity", "v", 0, "log verbosity: 0 writes and problems, 1 also writes retried because the cache was behind")
}

func newLogger(w io.Writer, format string, verbosity int) (logr.Logger, error) {
	// logr's V(n) is slog level -n.
	opts := &slog.HandlerOptions{Level: slog.Level(-verbosity)}
	switch format {
	case "json":
		return logr.FromSlogHandler(slog.NewJSONHandler(w, opts)), nil
	case "text":
		return logr.FromSlogHandler(slog.NewTextHandler(w, opts)), nil
	}
	return logr.Logger{}, fmt.Errorf("--log-format %q: want json or text", format)
}
