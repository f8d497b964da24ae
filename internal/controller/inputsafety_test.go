package controller

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/sylva-projects/osimages/internal/fleet"
	"github.com/sylva-projects/osimages/internal/oci"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/signature"
	"github.com/sylva-projects/osimages/internal/testenv"
)

// TestCheckReportsAFilenameNotServed: the copy of the served set says the
// image is available, and its served-filenames.yaml says under which
// filenames; the cluster's own catalog gives it another one, so the URL
// render writes would answer 404. The check says not-served, naming the
// filename, until the server serves that filename too.
func TestCheckReportsAFilenameNotServed(t *testing.T) {
	const label = "test-check/filenames"
	namespace(t, "check-files", map[string]string{label: ""})
	startManager(t, Options{Check: &CheckOptions{Namespaces: labels.SelectorFromSet(labels.Set{label: ""}), ServedCopy: "served", Resync: time.Hour}})

	info, err := osimage.MarshalInfo(osimage.Catalog{"ubuntu": {"sha256": sum("u"), "filename": "cluster.raw", "image-format": "raw", "os": "ubuntu",
		"k8s-flavor": "rke2", "k8s-version": "1.32.5+rke2r1"}})
	if err != nil {
		t.Fatal(err)
	}
	put(t, "check-files", "os-images-info", nil, string(info))
	put(t, "check-files", "values", map[string]string{fleet.ClusterValuesLabel: ""}, clusterValues)
	served := func(filenames string) {
		t.Helper()
		ctx := context.Background()
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "served", Namespace: "check-files"}, Data: map[string]string{
			"values.yaml":           "capm3_os_image_server_images:\n  " + sum("u") + ": {available: true, image_key: m}\n",
			"served-filenames.yaml": "served_filenames:\n  " + sum("u") + ": [" + filenames + "]\n",
		}}
		if _, err := suite.Kube(t).Client.CoreV1().ConfigMaps("check-files").Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
			if _, err := suite.Kube(t).Client.CoreV1().ConfigMaps("check-files").Create(ctx, cm, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	served("mgmt.raw")
	testenv.Eventually(t, "not-served reported for the filename", 30*time.Second, func() (bool, string) {
		p := status(t, "check-files").Problems()
		return len(p) == 1 && p[0].State == osimage.StateNotServed && strings.Contains(p[0].Message, "under the filename cluster.raw"), fmt.Sprint(status(t, "check-files"))
	})
	testenv.Eventually(t, "ImageNotServed event naming the filename", 30*time.Second, func() (bool, string) {
		evs := eventNotes(t, "check-files", "ImageNotServed")
		return len(evs) == 1 && strings.Contains(evs[0], "/images/"+sum("u")+"/cluster.raw would answer 404"), fmt.Sprint(evs)
	})
	served("cluster.raw, mgmt.raw")
	testenv.Eventually(t, "served once the filename is", 30*time.Second, func() (bool, string) {
		r := status(t, "check-files")
		return len(r.Images) == 1 && len(r.Problems()) == 0, fmt.Sprint(r)
	})
}

// TestCatalogRefusesAConfigMapTooLarge is item 13 for the controller: two
// catalog-values ConfigMaps, each fine, merge into a catalog that passes
// the 1 MiB a ConfigMap holds. The controller says so, naming the size and
// the image count, and writes nothing, instead of leaving it to the
// apiserver and retrying for ever.
func TestCatalogRefusesAConfigMapTooLarge(t *testing.T) {
	namespace(t, "catalog-large", nil)
	client, err := oci.NewClient(oci.Options{Insecure: true})
	if err != nil {
		t.Fatal(err)
	}
	readRegistry := Registry{Manifests: client, Signatures: signature.Verifier{Client: client}}
	// The inputs together pass the default --max-input-size too: raise it,
	// so that what is tested is the output's limit.
	startManager(t, Options{MaxInputSize: 4 << 20, Catalog: &CatalogOptions{Secure: readRegistry, Insecure: readRegistry, Timeout: 5 * time.Second}})
	half := func(from int) string {
		var b strings.Builder
		b.WriteString("os_images:\n")
		for i := from; i < from+850; i++ {
			fmt.Fprintf(&b, "  image-%04d: {uri: 'https://files.example.org/image-%04d.raw', sha256: '%s', image-format: raw, description: %s}\n", i, i, sum(fmt.Sprint(i)), strings.Repeat("x", 470))
		}
		return b.String()
	}
	put(t, "catalog-large", "inputs-a", map[string]string{fleet.CatalogValuesLabel: ""}, half(0))
	put(t, "catalog-large", "inputs-b", map[string]string{fleet.CatalogValuesLabel: ""}, half(850))
	testenv.Eventually(t, "CatalogValuesInvalid naming the size", 60*time.Second, func() (bool, string) {
		evs := eventNotes(t, "catalog-large", "CatalogValuesInvalid")
		return len(evs) > 0 && strings.Contains(evs[len(evs)-1], "ConfigMap catalog-large/os-images-info would hold") && strings.Contains(evs[len(evs)-1], "for 1700 images, over the 1048576 bytes"), fmt.Sprint(evs)
	})
	if _, err := suite.Kube(t).Client.CoreV1().ConfigMaps("catalog-large").Get(context.Background(), "os-images-info", metav1.GetOptions{}); err == nil {
		t.Error("os-images-info written")
	}
}

// TestCatalogRefusesToEmptyOSImagesInfo: catalog-values that lost their
// images do not wipe the namespace's os-images-info, unless annotated.
func TestCatalogRefusesToEmptyOSImagesInfo(t *testing.T) {
	namespace(t, "catalog-emptied", nil)
	client, err := oci.NewClient(oci.Options{Insecure: true})
	if err != nil {
		t.Fatal(err)
	}
	readRegistry := Registry{Manifests: client, Signatures: signature.Verifier{Client: client}}
	startManager(t, Options{Catalog: &CatalogOptions{Secure: readRegistry, Insecure: readRegistry, Timeout: 5 * time.Second}})
	ctx := context.Background()
	images := func() int {
		cm, err := suite.Kube(t).Client.CoreV1().ConfigMaps("catalog-emptied").Get(ctx, "os-images-info", metav1.GetOptions{})
		if err != nil {
			return -1
		}
		cat, _ := osimage.ParseInfo([]byte(cm.Data["values.yaml"]))
		return len(cat)
	}
	put(t, "catalog-emptied", "inputs", map[string]string{fleet.CatalogValuesLabel: ""}, "os_images:\n  mine: {uri: 'https://files.example.org/mine.raw', sha256: '"+sum("m")+"', image-format: raw}\n")
	testenv.Eventually(t, "os-images-info published", 30*time.Second, func() (bool, string) { return images() == 1, fmt.Sprint(images()) })

	put(t, "catalog-emptied", "inputs", nil, "units: {}\n")
	testenv.Eventually(t, "CatalogValuesInvalid", 30*time.Second, func() (bool, string) {
		evs := eventNotes(t, "catalog-emptied", "CatalogValuesInvalid")
		return len(evs) == 1 && strings.Contains(evs[0], "lists 1 images: not replaced"), fmt.Sprint(evs)
	})
	if n := images(); n != 1 {
		t.Fatalf("os-images-info emptied: %d images", n)
	}

	cm, err := suite.Kube(t).Client.CoreV1().ConfigMaps("catalog-emptied").Get(ctx, "inputs", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cm.Annotations = map[string]string{"osimages.sylva-project.org/allow-empty": "true"}
	if _, err := suite.Kube(t).Client.CoreV1().ConfigMaps("catalog-emptied").Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "emptied on purpose", 30*time.Second, func() (bool, string) { return images() == 0, fmt.Sprint(images()) })
}
