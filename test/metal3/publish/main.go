// Command publish puts the test image of Metal3 in a box
// (hack/e2e-metal3.sh) into the box's OCI registry the way Sylva's
// diskimage-builder CI does: one gzipped layer, the sylvaproject.org
// annotations, a cosign signature. It then writes the two values files an
// operator would hold: the sylva-units values the catalog resolves
// (-catalog-values) and the management cluster's values the image server
// selects with (-server-values), both naming the registry and the key.
//
//	publish -registry 127.0.0.1:5000 -image osimages-test.raw \
//	  -catalog-values catalog.yaml -server-values mgmt.yaml
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/sylva-projects/osimages/internal/devregistry"
	"github.com/sylva-projects/osimages/internal/osimage"
)

const tag = "0.0.1-m3box"

func main() {
	reg := flag.String("registry", "", "host:port of the registry (plain HTTP)")
	image := flag.String("image", "", "the raw disk image to publish")
	name := flag.String("name", "m3box-test", "the image's name (its os_images key)")
	repoBase := flag.String("repo-base", "sylva-projects/sylva-elements/diskimage-builder", "the repository path the registry's url names; the image goes under it (a registry with a signing key of its own needs a url of its own: every key whose url is a prefix of an image's must verify it)")
	regKey := flag.String("registry-key", "m3box", "the key of the registry in os_images_oci_registries (a second image is published under a key of its own, with its own signing key)")
	catalogOut := flag.String("catalog-values", "", "file to write the catalog's values to")
	serverOut := flag.String("server-values", "", "file to write the image server's management values to")
	flag.Parse()
	if *reg == "" || *image == "" || *catalogOut == "" || *serverOut == "" {
		fmt.Fprintln(os.Stderr, "publish: -registry, -image, -catalog-values and -server-values are required")
		os.Exit(2)
	}
	if err := run(*reg, *repoBase, *image, *name, *regKey, *catalogOut, *serverOut); err != nil {
		fmt.Fprintln(os.Stderr, "publish:", err)
		os.Exit(1)
	}
}

func run(reg, repoBase, image, name, registryKey, catalogOut, serverOut string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	pusher := &devregistry.Registry{Host: reg}
	signer, err := devregistry.NewSigner()
	if err != nil {
		return err
	}
	repo := repoBase + "/" + name
	p, err := pusher.Publish(ctx, devregistry.DiskImage{
		Repository: repo, Tag: tag, Gzip: true, ContentFile: image,
		Fields: osimage.Image{
			osimage.FieldFilename: "osimages-test.raw", osimage.FieldOS: "ubuntu",
			osimage.FieldOSRelease: "noble", osimage.FieldFlavor: "m3box",
			osimage.FieldHardened: "false", "k8s-flavor": "rke2", "k8s-version": "1.32.5+rke2r1",
		},
	})
	if err != nil {
		return fmt.Errorf("publishing %s to %s: %w", image, reg, err)
	}
	if err := pusher.Sign(ctx, signer, repo, p.ManifestDigest, devregistry.SignOptions{}); err != nil {
		return fmt.Errorf("signing %s: %w", p.Ref, err)
	}
	registries := map[string]any{registryKey: map[string]any{
		"url": "oci://" + reg + "/" + repoBase, "tag": tag,
		"cosign_publickey": signer.PublicKeyPEM, "enabled": true,
	}}
	catalog := map[string]any{
		"os_images_oci_registries":      registries,
		"sylva_diskimagebuilder_images": map[string]any{name: map[string]any{"os_images_oci_registry": registryKey}},
		"oci_registry_insecure":         true,
	}
	// The management cluster selects the test image for its image server
	// by an additional selector, as an operator serving a workload
	// cluster's image does.
	server := map[string]any{
		"name":                                 "management-cluster",
		"k8s_version":                          "v1.32.5+rke2r1",
		"capi_providers":                       map[string]any{"infra_provider": "capm3", "bootstrap_provider": "cabpr"},
		"oci_registry_insecure":                true,
		"os_images_oci_registries":             registries,
		"os_image_server_additional_selectors": map[string]any{"m3box": map[string]any{"flavor": "m3box"}},
	}
	for file, v := range map[string]any{catalogOut: catalog, serverOut: server} {
		data, err := yaml.Marshal(v)
		if err != nil {
			return err
		}
		if err := os.WriteFile(file, data, 0o644); err != nil {
			return err
		}
	}
	fmt.Printf("published %s sha256 %s manifest %s\n", p.Ref, p.Fields.Get(osimage.FieldSHA256), p.ManifestDigest)
	return nil
}
