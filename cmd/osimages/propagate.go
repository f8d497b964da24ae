package main

import (
	"time"

	"github.com/spf13/cobra"

	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/propagate"
)

func newPropagateCommand() *cobra.Command {
	o := propagate.CommandOptions{}
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
			return propagate.RunCommand(cmd.Context(), o, cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Config, "config", "", "rules file (default: Sylva's one rule)")
	f.BoolVar(&o.Adopt, "adopt", false, "take over objects of a target name that osimages did not create (such as Kyverno's copies) instead of leaving them alone")
	f.DurationVar(&o.Resync, "resync", 10*time.Minute, "check every copy at least this often, events or not")
	f.IntVar(&o.Workers, "workers", 8, "copies written at once")
	o.Manager.AddFlags(f, osimage.ServedConfigMapNamespace)
	return cmd
}
