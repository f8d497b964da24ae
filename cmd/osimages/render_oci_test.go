package main

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sylva-projects/osimages/internal/osimage"
)

// TestRenderChecksTheServedOCIManifest: render reads served-oci.yaml from
// the copy it checks against (--served-configmap), as the image server
// publishes it (ServedOutput.ConfigMapData), and writes the oci:// URL of
// the disk type's tag, which the server answers whatever size either
// catalog gives the image. A served-oci.yaml that is no document fails; a
// copy without the key (Sylva's server) checks nothing more than before.
func TestRenderChecksTheServedOCIManifest(t *testing.T) {
	k := apiserver(t)
	ctx := context.Background()
	const ns, host = "render-oci", "192.0.2.10"
	if _, err := k.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	const size = 1048576
	catalog := strings.ReplaceAll(osImagesDoc, "    oci-image-registry-key: sylva\n", "    oci-image-registry-key: sylva\n    size: \"1048576\"\n")
	put := func(name string, data map[string]string) {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Data: data}
		if _, err := k.Client.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			if _, err = k.Client.CoreV1().ConfigMaps(ns).Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	// served publishes both images as the server does, the plain one with
	// the size its own (management) catalog gives.
	served := func(plainSize int64) map[string]string {
		out := osimage.ServedOutput{Set: osimage.ServedSet{}, OCI: osimage.ServedOCI{}}
		for name, n := range map[string]int64{"plain": plainSize, "hardened": size} {
			sha := osimage.SHA256(sum(name))
			out.Set[sha] = osimage.ServedImage{Available: true, ImageKey: "mgmt-" + name}
			_, manifest := osimage.OCIManifest(sha, n)
			out.OCI[sha] = osimage.OCIServed{Repository: osimage.OCIRepository(sha), Manifest: manifest}
		}
		data, err := out.ConfigMapData("the served set")
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	put("os-images-info", map[string]string{osimage.ValuesKey: catalog})
	args := []string{"render", "-f", writeFile(t, "cluster.yaml", clusterDoc), "-f", writeFile(t, "oci.yaml", "capm3: {image_delivery: oci}\n"),
		"--kubeconfig", k.Kubeconfig, "--os-images-configmap", ns + "/os-images-info", "--served-configmap", ns + "/served"}

	put("served", served(size))
	r := run(t, args...)
	plainURL := osimage.OCIReference{Host: host, SHA256: osimage.SHA256(sum("plain")), DiskType: "raw"}.String()
	if r.code != 0 || !strings.Contains(r.stdout, "url: "+plainURL+"\n") {
		t.Fatalf("same size on both sides: exit %d, want %s in\n%s%s", r.code, plainURL, r.stdout, r.stderr)
	}

	// The tag answers from the verified image: the sizes need not agree.
	put("served", served(2*size))
	if r = run(t, args...); r.code != 0 || !strings.Contains(r.stdout, "url: "+plainURL+"\n") {
		t.Fatalf("sizes that differ: exit %d, want %s in\n%s%s", r.code, plainURL, r.stdout, r.stderr)
	}

	// A served-oci.yaml that parses as YAML but is no served_oci document:
	// render says which ConfigMap and key, and prints nothing.
	bad := served(size)
	bad[osimage.ServedOCIKey] = "served_oci: [" + sum("plain") + "]\n"
	put("served", bad)
	if r = run(t, args...); r.code != 2 || r.stdout != "" || !strings.Contains(r.stderr, "--served-configmap "+ns+"/served, key served-oci.yaml: parsing served_oci document") {
		t.Fatalf("served-oci.yaml that is no document: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}

	// Sylva's server publishes values.yaml alone: nobody can tell.
	put("served", map[string]string{osimage.ValuesKey: served(2 * size)[osimage.ValuesKey]})
	if r = run(t, args...); r.code != 0 || !strings.Contains(r.stdout, plainURL) {
		t.Fatalf("no served-oci.yaml: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
}
