package capm3

import (
	"context"
	"errors"
	"fmt"
	"io"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/sylva-projects/osimages/internal/exitcode"
	"github.com/sylva-projects/osimages/internal/kube"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/values"
)

// Options are those of `osimages render`, as its flags give them.
type Options struct {
	ValueFiles []string
	// OSImagesConfigMap (NS/NAME) is the cluster's os-images-info: (A) is
	// its os_images with the values' own merged on top.
	OSImagesConfigMap string
	// ServedConfigMap (NS/NAME) gives (B) instead of the values.
	ServedConfigMap string
	Kubeconfig      string
	APIVersion      string
	Namespace       string
	Apply           bool
}

// Run renders the templates of o.ValueFiles and prints them to stdout, or
// applies them (o.Apply), saying so on stderr. On any error nothing is
// printed or applied.
func Run(ctx context.Context, o Options, stdout, stderr io.Writer) error {
	if o.Apply && o.Namespace == "" {
		return exitcode.InputError(errors.New("--apply needs --namespace: templates live in the cluster's namespace"))
	}
	if _, err := normalizeAPIVersion(o.APIVersion); err != nil {
		return exitcode.InputError(fmt.Errorf("--api-version: %w", err))
	}
	if o.Namespace != "" {
		if err := kube.ValidateNamespace(o.Namespace); err != nil {
			return exitcode.InputError(fmt.Errorf("--namespace: %w", err))
		}
	}
	for _, f := range []struct{ flag, key string }{{"--os-images-configmap", o.OSImagesConfigMap}, {"--served-configmap", o.ServedConfigMap}} {
		if _, err := kube.ParseObjectKey(f.key); f.key != "" && err != nil {
			return exitcode.InputError(fmt.Errorf("%s %w", f.flag, err))
		}
	}
	v, err := values.LoadFiles(o.ValueFiles...)
	if err != nil {
		return exitcode.InputError(err)
	}
	a, b, err := CatalogsFromValues(v)
	if err != nil {
		return exitcode.InputError(err)
	}

	var cluster *kube.Target
	if o.Apply || o.OSImagesConfigMap != "" || o.ServedConfigMap != "" {
		if cluster, err = kube.NewTarget(o.Kubeconfig); err != nil {
			return exitcode.InputError(err)
		}
	}
	if o.OSImagesConfigMap != "" {
		doc, err := cluster.ConfigMapData(ctx, o.OSImagesConfigMap, osimage.ValuesKey)
		if err != nil {
			return exitcode.FailureError(err)
		}
		info, err := osimage.ParseInfo(doc)
		if err != nil {
			return exitcode.FailureError(fmt.Errorf("ConfigMap %s: %w", o.OSImagesConfigMap, err))
		}
		// (A) as Flux gives it to the chart: the ConfigMap (valuesFrom)
		// with the values' own os_images merged on top.
		if a, err = osimage.MergeA(info, v); err != nil {
			return exitcode.InputError(err)
		}
	}
	if o.ServedConfigMap != "" {
		doc, err := cluster.ConfigMapData(ctx, o.ServedConfigMap, osimage.ValuesKey)
		if err != nil {
			return exitcode.FailureError(err)
		}
		if b, err = osimage.ParseServed(doc); err != nil {
			return exitcode.FailureError(fmt.Errorf("ConfigMap %s: %w", o.ServedConfigMap, err))
		}
	}

	templates, err := Render(Input{Values: v, Catalog: a, Served: b, APIVersion: o.APIVersion, Namespace: o.Namespace})
	if err != nil {
		return exitcode.FailureError(err)
	}
	if o.Apply {
		objs := make([]*unstructured.Unstructured, len(templates))
		for i, t := range templates {
			objs[i] = &unstructured.Unstructured{Object: t.Object}
		}
		if err := kube.ApplyObjects(ctx, cluster.Config, objs); err != nil {
			return exitcode.FailureError(err)
		}
		for _, t := range templates {
			fmt.Fprintf(stderr, "%s/%s applied (%s, image %s)\n", o.Namespace, t.Name(), t.Level, orManual(t.ImageKey))
		}
		return nil
	}
	out, err := MarshalYAML(templates)
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
