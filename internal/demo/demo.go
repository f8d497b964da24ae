// Package demo is the embedded default: a complete run of osimages with no
// cluster and no outside registry. It publishes a few small generated
// diskimage-builder artifacts into an in-process registry on 127.0.0.1 and
// runs the catalog on them, then renders a sample workload cluster's
// Metal3MachineTemplates from that catalog.
package demo

import (
	"context"
	_ "embed"
	"fmt"
	"io"

	"sigs.k8s.io/yaml"

	"github.com/sylva-projects/osimages/internal/capm3"
	"github.com/sylva-projects/osimages/internal/catalog"
	"github.com/sylva-projects/osimages/internal/devregistry"
	"github.com/sylva-projects/osimages/internal/oci"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/values"
)

//go:embed values.yaml
var valuesYAML []byte

//go:embed cluster.yaml
var clusterYAML []byte

// Images are the artifacts the demo publishes, as diskimage-builder would.
var Images = []struct {
	Name   string
	Fields osimage.Image
}{
	{"ubuntu-noble-plain-rke2-1-32", dib("ubuntu", "noble", "plain", "rke2", "1.32.5+rke2r1")},
	{"ubuntu-noble-hardened-rke2-1-32", dib("ubuntu", "noble", "hardened", "rke2", "1.32.5+rke2r1")},
	{"ubuntu-noble-plain-kubeadm-1-32", dib("ubuntu", "noble", "plain", "kubeadm", "1.32.5")},
	{"leapmicro-6-0-plain-rke2-1-31", dib("leapmicro", "6.0", "plain", "rke2", "1.31.9+rke2r1")},
}

func dib(os, release, flavor, k8sFlavor, k8sVersion string) osimage.Image {
	hardened := "false"
	if flavor == "hardened" {
		hardened = "true"
	}
	return osimage.Image{
		osimage.FieldOS: os, osimage.FieldOSRelease: release,
		osimage.FieldFlavor: flavor, osimage.FieldHardened: hardened,
		osimage.FieldK8sFlavor: k8sFlavor, osimage.FieldK8sVersion: k8sVersion,
		osimage.FieldCommitID: "3f1c2a9e", osimage.FieldCommitTag: "0.7.6",
	}
}

// ImageSize is the size of each generated image file.
const ImageSize = 2 << 20

// Environment is a running demo registry holding the demo images.
type Environment struct {
	Registry *devregistry.Registry
	// Values are the demo's sylva-units values, pointing at Registry.
	Values values.Values
}

// Start publishes the demo images into a new in-process registry.
func Start(ctx context.Context) (*Environment, error) {
	reg, err := devregistry.Start(ctx, devregistry.Options{})
	if err != nil {
		return nil, err
	}
	vals, err := values.Parse(valuesYAML)
	if err != nil {
		reg.Close()
		return nil, fmt.Errorf("embedded demo values: %w", err)
	}
	vals["sylva_base_oci_registry"] = "oci://" + reg.Host + "/sylva-projects"
	vals["oci_registry_insecure"] = true
	tag, _ := vals["sylva_diskimagebuilder_version"].(string)
	for i, img := range Images {
		_, err := reg.Publish(ctx, devregistry.DiskImage{
			Repository: "sylva-projects/sylva-elements/diskimage-builder/" + img.Name,
			Tag:        tag,
			Content:    devregistry.DiskContent(ImageSize, uint64(i+1)),
			Gzip:       true,
			Fields:     img.Fields,
		})
		if err != nil {
			reg.Close()
			return nil, fmt.Errorf("publishing demo image %s: %w", img.Name, err)
		}
	}
	return &Environment{Registry: reg, Values: vals}, nil
}

// Close stops the registry.
func (e *Environment) Close() error { return e.Registry.Close() }

// Run starts the demo environment, runs the catalog on it, renders the
// Metal3MachineTemplates of a sample workload cluster from that catalog, and
// writes the os-images-info ConfigMap and the templates to out as one YAML
// stream. Progress goes to log.
func Run(ctx context.Context, out, log io.Writer) error {
	env, err := Start(ctx)
	if err != nil {
		return err
	}
	defer env.Close()
	fmt.Fprintf(log, "demo: published %d diskimage-builder artifacts to the in-process registry %s\n", len(Images), env.Registry.Host)

	plan, err := catalog.PlanFromValues(env.Values, nil)
	if err != nil {
		return err
	}
	client, err := oci.NewClient(oci.Options{Insecure: plan.Insecure})
	if err != nil {
		return err
	}
	resolved, err := catalog.Resolve(ctx, plan, client, catalog.ResolveOptions{})
	if err != nil {
		return err
	}
	cm, err := catalog.ConfigMap(catalog.DefaultNamespace, resolved, plan.InputsHash())
	if err != nil {
		return err
	}
	fmt.Fprintf(log, "demo: catalog resolved %d images into ConfigMap os-images-info\n", len(resolved))

	templates, err := RenderCluster(resolved, ServeAll(resolved))
	if err != nil {
		return err
	}
	for _, t := range templates {
		fmt.Fprintf(log, "demo: %s -> %s (image %s)\n", t.Level, t.Name(), t.ImageKey)
	}

	data, err := yaml.Marshal(cm)
	if err != nil {
		return err
	}
	docs, err := capm3.MarshalYAML(templates)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(out, "---\n%s%s", data, docs)
	return err
}

// ServeAll is the served set (B) of a management cluster that serves every
// image of cat that has a sha256, as the image server would publish it once
// all are downloaded and verified.
func ServeAll(cat osimage.Catalog) osimage.ServedSet {
	served := osimage.ServedSet{}
	for key, img := range cat {
		if sum := img[osimage.FieldSHA256]; sum != "" {
			served[sum] = osimage.ServedImage{Available: true, ImageKey: key}
		}
	}
	return served
}

// RenderCluster renders the demo's workload cluster with catalog (A) and
// served set (B).
func RenderCluster(a osimage.Catalog, b osimage.ServedSet) ([]capm3.Template, error) {
	v, err := values.Parse(clusterYAML)
	if err != nil {
		return nil, fmt.Errorf("embedded demo cluster values: %w", err)
	}
	return capm3.Render(capm3.Input{Values: v, Catalog: a, Served: b, Namespace: "demo-cluster"})
}
