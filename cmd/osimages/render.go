package main

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/sylva-projects/osimages/internal/capm3"
	"github.com/sylva-projects/osimages/internal/kube"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/values"
)

type renderOptions struct {
	valueFiles []string
	osImagesCM string
	servedCM   string
	kubeconfig string
	apiVersion string
	namespace  string
	apply      bool
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

On any error nothing is printed or applied, every failing level is listed,
and the exit code is 1 (2 for unreadable input).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runRender(cmd.Context(), o, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	f := cmd.Flags()
	f.StringArrayVarP(&o.valueFiles, "values", "f", nil, "cluster values file; repeat to merge several, later wins")
	f.StringVar(&o.osImagesCM, "os-images-configmap", "", "the cluster's os-images-info ConfigMap, NS/NAME: (A) is its os_images with the values' own merged on top")
	f.StringVar(&o.servedCM, "served-configmap", "", "read (B) from this served-images ConfigMap, NS/NAME")
	f.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file (default $KUBECONFIG, ~/.kube/config or in-cluster)")
	f.StringVar(&o.apiVersion, "api-version", "v1beta1", "Metal3MachineTemplate API version: v1beta1 (format) or v1beta2 (diskFormat)")
	f.StringVarP(&o.namespace, "namespace", "n", "", "namespace of the templates (required with --apply)")
	f.BoolVar(&o.apply, "apply", false, "write the templates with server-side apply instead of printing them")
	_ = cmd.MarkFlagRequired("values")
	return cmd
}

func runRender(ctx context.Context, o renderOptions, stdout, stderr io.Writer) error {
	if o.apply && o.namespace == "" {
		return inputError(errors.New("--apply needs --namespace: templates live in the cluster's namespace"))
	}
	v, err := values.LoadFiles(o.valueFiles...)
	if err != nil {
		return inputError(err)
	}
	a, b, err := capm3.CatalogsFromValues(v)
	if err != nil {
		return inputError(err)
	}

	var cluster *kubeTarget
	if o.apply || o.osImagesCM != "" || o.servedCM != "" {
		if cluster, err = newKubeTarget(o.kubeconfig); err != nil {
			return inputError(err)
		}
	}
	if o.osImagesCM != "" {
		doc, err := cluster.configMapValues(ctx, o.osImagesCM)
		if err != nil {
			return failureError(err)
		}
		info, err := osimage.ParseInfo(doc)
		if err != nil {
			return failureError(fmt.Errorf("ConfigMap %s: %w", o.osImagesCM, err))
		}
		// (A) as Flux gives it to the chart: the ConfigMap (valuesFrom)
		// with the values' own os_images merged on top.
		if a, err = osimage.MergeA(info, v); err != nil {
			return inputError(err)
		}
	}
	if o.servedCM != "" {
		doc, err := cluster.configMapValues(ctx, o.servedCM)
		if err != nil {
			return failureError(err)
		}
		if b, err = osimage.ParseServed(doc); err != nil {
			return failureError(fmt.Errorf("ConfigMap %s: %w", o.servedCM, err))
		}
	}

	templates, err := capm3.Render(capm3.Input{Values: v, Catalog: a, Served: b, APIVersion: o.apiVersion, Namespace: o.namespace})
	if err != nil {
		return failureError(err)
	}
	if o.apply {
		objs := make([]*unstructured.Unstructured, len(templates))
		for i, t := range templates {
			objs[i] = &unstructured.Unstructured{Object: t.Object}
		}
		if err := kube.ApplyObjects(ctx, cluster.config, objs); err != nil {
			return failureError(err)
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
