package main

import (
	"github.com/spf13/cobra"

	"github.com/sylva-projects/osimages/internal/capm3"
)

func newRenderCommand() *cobra.Command {
	o := capm3.Options{}
	cmd := &cobra.Command{
		Use:   "render -f cluster-values.yaml [-f ...]",
		Short: "Render the Metal3MachineTemplates of a cluster, each image picked from the cluster's own catalog",
		Long: `render reads sylva-capi-cluster values, picks the image of the control plane
and of each machine deployment from the cluster's own os_images (A), checks
that the management cluster serves its sha256 (B), and prints the
Metal3MachineTemplates as YAML, or applies them with --apply.

(A) and (B) come from the values (os_images, capm3_os_image_server_images).
--os-images-configmap names the cluster's os-images-info: (A) is then its
os_images with the values' own os_images merged on top, image by image and
field by field, as Flux merges a HelmRelease's valuesFrom and inline values.
--served-configmap names a ConfigMap to read (B) from instead. Template names end with a hash of their spec: they change only when
the image (or another spec field) does.

On any error nothing is printed or applied, every failing level is listed,
and the exit code is 1 (2 for unreadable input).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return capm3.Run(cmd.Context(), o, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	f.StringArrayVarP(&o.ValueFiles, "values", "f", nil, "cluster values file; repeat to merge several, later wins")
	f.StringVar(&o.OSImagesConfigMap, "os-images-configmap", "", "the cluster's os-images-info ConfigMap, NS/NAME: (A) is its os_images with the values' own merged on top")
	f.StringVar(&o.ServedConfigMap, "served-configmap", "", "read (B) from this served-images ConfigMap, NS/NAME")
	addKubeconfigFlag(f, &o.Kubeconfig)
	f.StringVar(&o.APIVersion, "api-version", "v1beta1", "Metal3MachineTemplate API version: v1beta1 (format) or v1beta2 (diskFormat)")
	f.StringVarP(&o.Namespace, "namespace", "n", "", "namespace of the templates (required with --apply)")
	f.BoolVar(&o.Apply, "apply", false, "write the templates with server-side apply instead of printing them")
	_ = cmd.MarkFlagRequired("values")
	return cmd
}
