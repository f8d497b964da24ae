package main

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sylva-projects/osimages/internal/capm3"
	"github.com/sylva-projects/osimages/internal/exitcode"
	"github.com/sylva-projects/osimages/internal/kube"
	"github.com/sylva-projects/osimages/internal/metal3"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/values"
)

// renderOptions are the flags of `osimages render`.
type renderOptions struct {
	valueFiles []string
	// osImagesConfigMap (NS/NAME) is the cluster's os-images-info: (A) is
	// its os_images with the values' own merged on top.
	osImagesConfigMap string
	// servedConfigMap (NS/NAME) gives (B) instead of the values.
	servedConfigMap string
	kubeconfig      string
	apiVersion      string
	namespace       string
	apply           bool
}

func newRenderCommand() *cobra.Command {
	o := renderOptions{}
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

Whenever it connects to a cluster (--apply, --os-images-configmap,
--served-configmap), render reads the Metal3MachineTemplate CRD of the CAPM3
installed there: when its schema requires image.checksum (CAPM3 before
v1.14.0), each level with image_delivery: oci fails, naming the release
needed, instead of writing a template that CAPM3 would refuse. From files
alone it cannot tell, and renders as asked.

On any error nothing is printed or applied and every failing level is
listed. The exit code is 1 when a pick fails (no image, or several, for a
level) or the image picked is not served (yet); 2 when an input is wrong:
a flag, a value, an image record of (A) (a sha256 that is not 64 lowercase
hex digits, a filename the server cannot serve, an image-format Metal3
does not know), or a ConfigMap that does not parse.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runRender(cmd.Context(), o, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	f.StringArrayVarP(&o.valueFiles, "values", "f", nil, "cluster values file; repeat to merge several, later wins")
	f.StringVar(&o.osImagesConfigMap, "os-images-configmap", "", "the cluster's os-images-info ConfigMap, NS/NAME: (A) is its os_images with the values' own merged on top")
	f.StringVar(&o.servedConfigMap, "served-configmap", "", "read (B) from this served-images ConfigMap, NS/NAME (its values.yaml, and served-oci.yaml when there: an oci:// URL must name the manifest the server answers)")
	addKubeconfigFlag(f, &o.kubeconfig)
	f.StringVar(&o.apiVersion, "api-version", "v1beta1", "Metal3MachineTemplate API version: v1beta1 (format) or v1beta2 (diskFormat)")
	f.StringVarP(&o.namespace, "namespace", "n", "", "namespace of the templates (required with --apply)")
	f.BoolVar(&o.apply, "apply", false, "write the templates with server-side apply instead of printing them")
	_ = cmd.MarkFlagRequired("values")
	return cmd
}

// runRender renders the templates of o.valueFiles and prints them to
// stdout, or applies them (o.apply), saying so on stderr. On any error
// nothing is printed or applied. The renderer only returns objects: the
// command reads its inputs from the cluster, and applies what it returns.
func runRender(ctx context.Context, o renderOptions, stdout, stderr io.Writer) error {
	if o.apply && o.namespace == "" {
		return exitcode.InputError(errors.New("--apply needs --namespace: templates live in the cluster's namespace"))
	}
	apiVersion, err := capm3.NormalizeAPIVersion(o.apiVersion)
	if err != nil {
		return exitcode.InputError(fmt.Errorf("--api-version: %w", err))
	}
	if o.namespace != "" {
		if err := kube.ValidateNamespace(o.namespace); err != nil {
			return exitcode.InputError(fmt.Errorf("--namespace: %w", err))
		}
	}
	for _, f := range []struct{ flag, key string }{{"--os-images-configmap", o.osImagesConfigMap}, {"--served-configmap", o.servedConfigMap}} {
		if _, err := kube.ParseObjectKey(f.key); f.key != "" && err != nil {
			return exitcode.InputError(fmt.Errorf("%s %w", f.flag, err))
		}
	}
	v, err := values.LoadFiles(o.valueFiles...)
	if err != nil {
		return exitcode.InputError(err)
	}
	a, b, err := capm3.CatalogsFromValues(v)
	if err != nil {
		return exitcode.InputError(err)
	}

	var cluster *kube.Target
	if o.apply || o.osImagesConfigMap != "" || o.servedConfigMap != "" {
		if cluster, err = kube.NewTarget(o.kubeconfig); err != nil {
			return exitcode.InputError(err)
		}
	}
	if o.osImagesConfigMap != "" {
		doc, err := cluster.ConfigMapData(ctx, o.osImagesConfigMap, osimage.ValuesKey)
		if err != nil {
			return exitcode.FailureError(err)
		}
		info, err := osimage.ParseInfo(doc)
		if err != nil {
			return exitcode.InputError(fmt.Errorf("--os-images-configmap %s: %w", o.osImagesConfigMap, err))
		}
		// (A) as Flux gives it to the chart: the ConfigMap (valuesFrom)
		// with the values' own os_images merged on top.
		if a, err = osimage.MergeA(info, v); err != nil {
			return exitcode.InputError(err)
		}
	}
	var bOCI osimage.ServedOCI
	if o.servedConfigMap != "" {
		docs, err := cluster.ConfigMapDocuments(ctx, o.servedConfigMap, osimage.ValuesKey, osimage.ServedOCIKey)
		if err != nil {
			return exitcode.FailureError(err)
		}
		if b, err = osimage.ParseServed(docs[osimage.ValuesKey]); err != nil {
			return exitcode.InputError(fmt.Errorf("--served-configmap %s: %w", o.servedConfigMap, err))
		}
		// An osimages server's copy also says which manifest each image's
		// oci:// URL answers; Sylva's does not, and then nobody can tell.
		if doc, ok := docs[osimage.ServedOCIKey]; ok {
			if bOCI, err = osimage.ParseServedOCI(doc); err != nil {
				return exitcode.InputError(fmt.Errorf("--served-configmap %s, key %s: %w", o.servedConfigMap, osimage.ServedOCIKey, err))
			}
		}
	}

	// The cluster's CAPM3 may refuse oci:// images (before v1.14.0): its
	// CRD says so, and render fails rather than write templates it
	// refuses. Rendering from files alone cannot tell.
	var ociRefused error
	if cluster != nil {
		c, err := client.New(cluster.Config, client.Options{})
		if err != nil {
			return exitcode.FailureError(err)
		}
		if ociRefused, err = metal3.ReadOCIRefusal(ctx, c, schema.FromAPIVersionAndKind(apiVersion, "").Version); err != nil {
			return exitcode.FailureError(err)
		}
	}
	var catalogFrom string
	if o.osImagesConfigMap != "" {
		catalogFrom = "ConfigMap " + o.osImagesConfigMap + " (--os-images-configmap)"
	}
	templates, err := capm3.Render(capm3.Input{Values: v, Catalog: a, CatalogFrom: catalogFrom, Served: b, ServedOCI: bOCI, APIVersion: o.apiVersion, Namespace: o.namespace, OCIRefused: ociRefused})
	if capm3.InputFault(err) {
		// A value or an image record that cannot be used as it is: the
		// operator's to fix, whatever else failed with it.
		return exitcode.InputError(err)
	}
	if err != nil {
		return exitcode.FailureError(err)
	}
	if o.apply {
		objs := make([]*unstructured.Unstructured, len(templates))
		for i, t := range templates {
			objs[i] = &unstructured.Unstructured{Object: t.Object}
		}
		if err := kube.ApplyObjects(ctx, cluster.Config, objs); err != nil {
			return exitcode.FailureError(err)
		}
		for _, t := range templates {
			fmt.Fprintf(stderr, "%s/%s applied (%s, image %s)\n", o.namespace, t.Name(), t.Level, orManual(t.ImageKey))
		}
		return nil
	}
	out, err := capm3.MarshalYAML(templates)
	if err != nil {
		return err
	}
	_, err = stdout.Write(out)
	return err
}

func orManual(key string) string {
	if key == "" {
		return "given by hand"
	}
	return key
}
