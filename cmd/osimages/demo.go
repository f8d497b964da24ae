//go:build !nodemo

package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/sylva-projects/osimages/internal/demo"
	"github.com/sylva-projects/osimages/internal/exitcode"
	"github.com/sylva-projects/osimages/internal/kube"
)

func newDemoCommand() *cobra.Command {
	o := demo.Options{}
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run osimages end to end on an embedded default, with no cluster and no outside registry",
		Long: `demo starts an OCI registry in this process on 127.0.0.1, publishes a few
small generated diskimage-builder artifacts into it, resolves the catalog
from the embedded sylva-units values, pulls, verifies and serves the images the
management cluster selects on 127.0.0.1 (printing their URLs), and renders a
sample workload cluster's Metal3MachineTemplates against what is served.

Standard output is one YAML stream: os-images-info, the served-images
ConfigMap, the templates. The server then keeps serving until Ctrl-C, unless
--once.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := kube.ValidateListenAddress(o.Listen); o.Listen != "" && err != nil {
				return exitcode.InputError(fmt.Errorf("--listen: %w", err))
			}
			return demo.Run(cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr(), o)
		},
	}
	cmd.Flags().BoolVar(&o.Once, "once", false, "exit after the demo instead of serving until Ctrl-C")
	cmd.Flags().StringVar(&o.Listen, "listen", "127.0.0.1:0", "where the demo's image server listens")
	return cmd
}
