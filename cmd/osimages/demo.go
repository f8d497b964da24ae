package main

import (
	"github.com/spf13/cobra"

	"github.com/sylva-projects/osimages/internal/demo"
)

func newDemoCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "demo",
		Short: "Run osimages end to end on an embedded default, with no cluster and no outside registry",
		Long: `demo starts an OCI registry in this process on 127.0.0.1, publishes a few
small generated diskimage-builder artifacts into it, resolves the catalog
from the embedded sylva-units values and prints ConfigMap os-images-info.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return demo.Run(cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
}
