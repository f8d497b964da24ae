package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/sylva-projects/osimages/internal/kube"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/propagate"
)

type propagateOptions struct {
	manager kube.ManagerFlags
	config  string
	adopt   bool
	resync  time.Duration
	workers int
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
	o.manager.AddFlags(f, osimage.ServedConfigMapNamespace)
	return cmd
}

func runPropagate(cmd *cobra.Command, o propagateOptions) error {
	if o.workers < 1 {
		return inputError(fmt.Errorf("--workers %d: must be at least 1", o.workers))
	}
	if o.resync <= 0 {
		return inputError(fmt.Errorf("--resync %s: must be positive", o.resync))
	}
	if err := o.manager.Validate(); err != nil {
		return inputError(err)
	}
	rules := propagate.DefaultRules()
	var err error
	if o.config != "" {
		if rules, err = propagate.LoadRules(o.config); err != nil {
			return inputError(err)
		}
	}
	cfg, mgr, err := o.manager.Setup(cmd.ErrOrStderr(), "")
	if err != nil {
		return inputError(err)
	}
	for _, r := range rules {
		mgr.Logger.Info("rule", "name", r.Name, "source", r.Source.String(), "target", r.Target, "namespaceSelector", r.Selector.String())
	}
	opts := propagate.Options{Rules: rules, Adopt: o.adopt, Resync: o.resync, Workers: o.workers, ManagerOptions: mgr}
	return failureError(propagate.Run(cmd.Context(), cfg, opts))
}
