package main

import (
	"time"

	"github.com/spf13/cobra"

	"github.com/sylva-projects/osimages/internal/catalog"
)

func newCatalogCommand() *cobra.Command {
	o := catalog.Options{}
	cmd := &cobra.Command{
		Use:   "catalog -f values.yaml [-f more.yaml ...]",
		Short: "Resolve the metadata of every candidate OS image into ConfigMap os-images-info",
		Long: `catalog reads sylva-units values (os_images_oci_registries,
sylva_diskimagebuilder_images, os_images), fetches the manifest of every OCI
image, keeps its sylva annotations as image fields, and prints ConfigMap
os-images-info as YAML, or applies it with --apply. An image of a registry
with a cosign_publickey is published only when its cosign signature
verifies (unless security.os_images.skip_signing_check is true); the
manifest digest resolved is recorded as oci-manifest-digest.

A key that osimages reads but that the values lack, while they hold a
look-alike of it (os_image, cosign_public_key), is a values error with a
"did you mean" hint. With --apply, an os-images-info that lists images is
not replaced by an empty one unless --allow-empty is given. A catalog that
a ConfigMap cannot hold (1 MiB) is refused before anything is written.

Exit codes: 0 done, 1 some image could not be resolved (all are listed, and
nothing is printed or applied), 2 the values are wrong.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return catalog.Run(cmd.Context(), o, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	f.StringArrayVarP(&o.ValueFiles, "values", "f", nil, "values file; repeat to merge several, later wins")
	f.StringVarP(&o.Namespace, "namespace", "n", catalog.DefaultNamespace, "namespace of the os-images-info ConfigMap")
	f.StringVar(&o.Filter, "filter", "", "resolve only the images whose key or registry key fully matches this regular expression")
	f.BoolVar(&o.Apply, "apply", false, "write the ConfigMap to the cluster with server-side apply instead of printing it")
	f.BoolVar(&o.Force, "force", false, "with --apply, resolve and write even when the inputs are unchanged")
	f.BoolVar(&o.AllowEmpty, "allow-empty", false, "with --apply, replace an os-images-info that lists images with an empty one (refused otherwise)")
	addKubeconfigFlag(f, &o.Kubeconfig)
	addRegistryFlags(f, &o.Registry)
	f.IntVar(&o.Concurrency, "concurrency", 8, "manifests fetched at once")
	f.DurationVar(&o.Timeout, "timeout", 60*time.Second, "time allowed to resolve one image, retries included")
	_ = cmd.MarkFlagRequired("values")
	return cmd
}
