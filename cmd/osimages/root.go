package main

import (
	"github.com/spf13/cobra"
)

func newRootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "osimages",
		Short: "Resolve, serve and render the OS images of Metal3 bare-metal clusters",
		Long: `osimages manages the operating-system images that bare-metal Kubernetes
nodes boot from, for fleets of Cluster API Provider Metal3 clusters built with
Sylva: it resolves image catalogs from OCI registries, serves verified images
to Ironic, propagates what is served, and renders Metal3MachineTemplates.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newCatalogCommand(), newSelectCommand(), newRenderCommand(), newServeCommand(), newPropagateCommand(),
		newControllerCommand(), newPlanCommand(), newDemoCommand())
	return root
}
