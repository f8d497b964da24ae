package main

import (
	"github.com/spf13/cobra"

	"github.com/sylva-projects/osimages/internal/levels"
)

func newSelectCommand() *cobra.Command {
	o := levels.SelectOptions{}
	cmd := &cobra.Command{
		Use:   "select (--os-images FILE --selector KEY=PATTERN ... | [--os-images FILE] --cluster-values FILE --level PATH)",
		Short: "List the images an OS image selector matches, to debug selectors",
		Long: `select lists the keys and sha256 of the images of an os_images catalog that a
selector matches, then says whether picking one image would succeed.

The catalog is a values document holding os_images, or an os-images-info
ConfigMap. The selector is given key by key with --selector (not finalized),
or taken from a level of cluster values with --cluster-values and --level
(such as .control_plane.capm3 or .machine_deployments.md0.capm3), merged and
finalized exactly as render does. With --cluster-values, the catalog is (A)
as render sees it: the os_images of --os-images (the cluster's
os-images-info), with the values' own os_images merged on top.

Exit codes: 0 exactly one image is picked, 1 the pick would fail (or the
level designates no image), 2 bad input.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return levels.RunSelect(o, cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.OSImages, "os-images", "", "os_images document or os-images-info ConfigMap (YAML)")
	f.StringArrayVar(&o.Selectors, "selector", nil, "selector term KEY=PATTERN; repeat for several (all must match)")
	f.StringArrayVar(&o.ClusterValues, "cluster-values", nil, "cluster values file; repeat to merge several, later wins")
	f.StringVar(&o.Level, "level", "", "values path of the level whose selector to use, with --cluster-values")
	return cmd
}
