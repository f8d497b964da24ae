package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/sylva-projects/osimages/internal/catalog"
	"github.com/sylva-projects/osimages/internal/exitcode"
	"github.com/sylva-projects/osimages/internal/kube"
	"github.com/sylva-projects/osimages/internal/oci"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/signature"
	"github.com/sylva-projects/osimages/internal/values"
)

// catalogOptions are the flags of `osimages catalog`.
type catalogOptions struct {
	valueFiles []string
	namespace  string
	// filter is a regular expression of the image or registry keys to
	// resolve.
	filter string
	// apply writes the ConfigMap (server-side apply) instead of printing
	// it; force resolves even when its inputs are unchanged, allowEmpty
	// lets an empty catalog replace one that lists images.
	apply, force, allowEmpty bool
	kubeconfig               string
	registry                 oci.Options
	concurrency              int
	timeout                  time.Duration
}

func newCatalogCommand() *cobra.Command {
	o := catalogOptions{}
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
			return runCatalog(cmd.Context(), o, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	f.StringArrayVarP(&o.valueFiles, "values", "f", nil, "values file; repeat to merge several, later wins")
	f.StringVarP(&o.namespace, "namespace", "n", catalog.DefaultNamespace, "namespace of the os-images-info ConfigMap")
	f.StringVar(&o.filter, "filter", "", "resolve only the images whose key or registry key fully matches this regular expression")
	f.BoolVar(&o.apply, "apply", false, "write the ConfigMap to the cluster with server-side apply instead of printing it")
	f.BoolVar(&o.force, "force", false, "with --apply, resolve and write even when the inputs are unchanged")
	f.BoolVar(&o.allowEmpty, "allow-empty", false, "with --apply, replace an os-images-info that lists images with an empty one (refused otherwise)")
	addKubeconfigFlag(f, &o.kubeconfig)
	addRegistryFlags(f, &o.registry)
	f.IntVar(&o.concurrency, "concurrency", 8, "manifests fetched at once")
	f.DurationVar(&o.timeout, "timeout", 60*time.Second, "time allowed to resolve one image, retries included")
	_ = cmd.MarkFlagRequired("values")
	return cmd
}

// runCatalog resolves the catalog of o.valueFiles and prints os-images-info
// to stdout, or applies it (o.apply); what it does goes to stderr. A
// resolve that fails exits 1, wrong values 2.
func runCatalog(ctx context.Context, o catalogOptions, stdout, stderr io.Writer) error {
	if o.concurrency < 1 {
		return exitcode.InputError(fmt.Errorf("--concurrency must be at least 1"))
	}
	if o.timeout <= 0 {
		return exitcode.InputError(fmt.Errorf("--timeout %s: give a positive duration, such as 60s", o.timeout))
	}
	if err := kube.ValidateNamespace(o.namespace); err != nil {
		return exitcode.InputError(fmt.Errorf("--namespace: %w", err))
	}
	filter, err := catalog.CompileFilter(o.filter)
	if err != nil {
		return exitcode.InputError(fmt.Errorf("--filter %w", err))
	}
	vals, err := values.LoadFiles(o.valueFiles...)
	if err != nil {
		return exitcode.InputError(err)
	}
	plan, err := catalog.PlanFromValuesContext(ctx, vals, filter)
	if err != nil {
		if ctx.Err() != nil {
			return err
		}
		return exitcode.InputError(err)
	}
	hash := plan.InputsHash()

	var apply func(*corev1.ConfigMap) error
	if o.apply {
		client, err := kube.Clientset(o.kubeconfig)
		if err != nil {
			return exitcode.InputError(err)
		}
		key := kube.ObjectKey{Namespace: o.namespace, Name: osimage.InfoConfigMapName}
		current, err := kube.GetConfigMap(ctx, client, key)
		if err != nil {
			return exitcode.FailureError(err)
		}
		if catalog.UpToDate(current, hash) && !o.force {
			fmt.Fprintf(stderr, "ConfigMap %s is up to date (inputs %s); nothing to do (--force resolves again)\n", key, hash)
			return nil
		}
		// Every source resolves to one image or the run fails: an empty
		// plan is an empty catalog, refused before any registry request.
		if err := catalog.CheckEmptying(current, len(plan.Sources), o.allowEmpty); err != nil {
			return exitcode.InputError(err)
		}
		apply = func(cm *corev1.ConfigMap) error {
			if _, err := kube.ApplyConfigMap(ctx, client, cm); err != nil {
				return err
			}
			fmt.Fprintf(stderr, "ConfigMap %s applied: %d images\n", key, len(plan.Sources))
			return nil
		}
	}

	client, err := oci.NewClient(oci.Options{
		Insecure:        plan.Insecure,
		CAFile:          o.registry.CAFile,
		RegistryConfig:  o.registry.RegistryConfig,
		MaxConnsPerHost: o.concurrency,
	})
	if err != nil {
		return exitcode.InputError(err)
	}
	if plan.SkipSigningCheck && len(plan.KeyedRegistries) > 0 {
		fmt.Fprintf(stderr, "%s is true: cosign signatures are NOT checked (registries with a cosign_publickey: %s)\n",
			catalog.SkipPath, strings.Join(plan.KeyedRegistries, ", "))
	} else if unchecked := plan.Unchecked(); len(unchecked) > 0 && len(plan.KeyedRegistries) > 0 && !plan.RequireSignatures {
		// Say which images go unchecked, rather than let "signatures are
		// checked" be read as "every image is checked".
		fmt.Fprintf(stderr, "no cosign_publickey applies to %d OCI images, published without a signature check: %s (%s: true refuses them)\n",
			len(unchecked), strings.Join(unchecked, ", "), catalog.RequirePath)
	}
	resolved, err := catalog.Resolve(ctx, plan, client, catalog.ResolveOptions{
		Concurrency: o.concurrency, Timeout: o.timeout,
		Signatures: signature.Verifier{Client: client},
	})
	if err != nil {
		var report *catalog.ResolveError
		if errors.As(err, &report) {
			return exitcode.FailureError(err)
		}
		return err
	}
	cm, err := catalog.ConfigMap(o.namespace, resolved, hash)
	var tooLarge *osimage.SizeError
	if errors.As(err, &tooLarge) {
		return exitcode.InputError(err)
	}
	if err != nil {
		return err
	}
	if len(resolved) == 0 {
		fmt.Fprintf(stderr, "warning: the values declare no image (os_images, sylva_diskimagebuilder_images%s): os-images-info is empty\n", filterNote(o.filter))
	}
	if apply != nil {
		return exitcode.FailureError(apply(cm))
	}
	out, err := yaml.Marshal(cm)
	if err != nil {
		return err
	}
	_, err = stdout.Write(out)
	return err
}

func filterNote(filter string) string {
	if filter == "" {
		return ""
	}
	return fmt.Sprintf(", --filter %q", filter)
}
