package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/sylva-projects/osimages/internal/exitcode"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/propagate"
)

// propagateOptions are the flags of `osimages propagate`.
type propagateOptions struct {
	manager managerFlags
	// config is the rules file; "" is Sylva's one rule.
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
sylva-project.org/workload-cluster="", each copy holding only the served entries
whose sha256 that namespace's os-images-info names (or its osimages-status lists
as needed); a namespace without a readable os-images-info gets no entry. A rules
file reads:

  rules:
  - name: os-image-server-images
    source: sylva-system/capm3-os-image-server-os-images
    target: kyverno-cloned-os-image-server-images
    namespaceSelector:
      matchLabels: {sylva-project.org/workload-cluster: ""}
    catalog: os-images-info   # leave out to copy the source whole

When the source is deleted the copies are kept and annotated stale; an object
of the target name that osimages did not create is left alone unless --adopt.

Exit codes: 0 stopped by a signal, 1 the controller failed, 2 wrong flags or rules.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runPropagate(cmd.Context(), o, cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.config, "config", "", "rules file (default: Sylva's one rule)")
	f.BoolVar(&o.adopt, "adopt", false, "take over objects of a target name that osimages did not create (such as Kyverno's copies) instead of leaving them alone")
	f.DurationVar(&o.resync, "resync", 10*time.Minute, "check every copy at least this often, events or not")
	f.IntVar(&o.workers, "workers", 8, "copies written at once")
	o.manager.addFlags(f, osimage.ServedConfigMapNamespace)
	return cmd
}

// runPropagate checks o, then propagates until ctx ends, logging to
// stderr. Wrong flags or rules exit 2, a controller that fails 1.
func runPropagate(ctx context.Context, o propagateOptions, stderr io.Writer) error {
	if o.workers < 1 {
		return exitcode.InputError(fmt.Errorf("--workers %d: must be at least 1", o.workers))
	}
	if o.resync <= 0 {
		return exitcode.InputError(fmt.Errorf("--resync %s: must be positive", o.resync))
	}
	if err := o.manager.validate(); err != nil {
		return exitcode.InputError(err)
	}
	rules, err := propagate.LoadRulesOrDefault(o.config)
	if err != nil {
		return exitcode.InputError(err)
	}
	cfg, mgr, err := o.manager.setup(stderr, "")
	if err != nil {
		return exitcode.InputError(err)
	}
	for _, r := range rules {
		mgr.Logger.Info("rule", "name", r.Name, "source", r.Source.String(), "target", r.Target, "namespaceSelector", r.Selector.String(), "catalog", r.Catalog)
	}
	opts := propagate.Options{Rules: rules, Adopt: o.adopt, Resync: o.resync, Workers: o.workers, ManagerOptions: mgr}
	return exitcode.FailureError(propagate.Run(ctx, cfg, opts))
}
