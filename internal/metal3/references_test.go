package metal3

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/testenv"
)

// References, on its own against a real apiserver: with no Metal3 API it
// is synced and empty; once capm3's CRDs are installed it finds them
// without a restart, and follows each object's image as it is created,
// changed and deleted. ServedKinds and List, which the check and plan
// use, see the same.
func TestReferencesFollowsMetal3Objects(t *testing.T) {
	k, installMetal3 := testenv.KubeWithoutMetal3(t)
	dyn, err := dynamic.NewForConfig(k.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	refs := NewReferences(dyn, k.Client.Discovery(), nil)
	go func() { defer close(done); refs.Run(ctx, 100*time.Millisecond) }()
	testenv.Eventually(t, "synced with no Metal3 API", 30*time.Second, func() (bool, string) { return refs.Synced(), "" })
	// The check and plan's view of the same: no kind served, nothing listed.
	c, err := client.New(k.Config, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if kinds, err := ServedKinds(c.RESTMapper()); err != nil || len(kinds) != 0 {
		t.Fatalf("kinds served without capm3: %v %v", kinds, err)
	}

	installMetal3()
	k.Namespace(t, "refs", nil)
	a, b := strings.Repeat("a", 64), strings.Repeat("b", 64)
	tmpl := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": Group + "/v1beta2", "kind": KindMachineTemplate,
		"metadata": map[string]any{"name": "t0"},
		"spec": map[string]any{"template": map[string]any{"spec": map[string]any{"image": map[string]any{
			"url": "http://osimages/images/" + a + "/x.raw", "checksum": a, "checksumType": "sha256", "diskFormat": "raw"}}}},
	}}
	machine := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": Group + "/v1beta2", "kind": KindMachine,
		"metadata": map[string]any{"name": "m0"},
		"spec": map[string]any{"image": map[string]any{
			"url": "http://osimages/images/" + a + "/x.raw", "checksum": a, "checksumType": "sha256", "diskFormat": "raw"}},
	}}
	templates := dyn.Resource(schema.GroupVersionResource{Group: Group, Version: "v1beta2", Resource: "metal3machinetemplates"}).Namespace("refs")
	machines := dyn.Resource(schema.GroupVersionResource{Group: Group, Version: "v1beta2", Resource: "metal3machines"}).Namespace("refs")
	if tmpl, err = templates.Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := machines.Create(ctx, machine, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	want := func(sha string, by ...string) {
		t.Helper()
		testenv.Eventually(t, fmt.Sprintf("%s referenced by %v", sha[:4], by), 30*time.Second, func() (bool, string) {
			got := refs.ReferencedBy(osimage.SHA256(sha))
			return refs.Synced() && slices.Equal(got, by), fmt.Sprintf("synced %v, %v", refs.Synced(), got)
		})
	}
	want(a, "Metal3Machine refs/m0", "Metal3MachineTemplate refs/t0")

	// The same mapper finds the kinds installed since, and List reads
	// their objects, kind after kind.
	kinds, err := ServedKinds(c.RESTMapper())
	if err != nil || len(kinds) != 2 || kinds[0].Kind != KindMachineTemplate || kinds[1].Kind != KindMachine {
		t.Fatalf("kinds served with capm3: %v %v", kinds, err)
	}
	listed, err := List(ctx, c, "refs", kinds)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, u := range listed {
		names = append(names, u.GetKind()+" "+u.GetName())
	}
	if !slices.Equal(names, []string{KindMachineTemplate + " t0", KindMachine + " m0"}) {
		t.Errorf("listed %v", names)
	}

	// The template moves to image b: a keeps only the machine.
	_ = unstructured.SetNestedField(tmpl.Object, "http://osimages/images/"+b+"/x.raw", "spec", "template", "spec", "image", "url")
	_ = unstructured.SetNestedField(tmpl.Object, b, "spec", "template", "spec", "image", "checksum")
	if _, err := templates.Update(ctx, tmpl, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	want(b, "Metal3MachineTemplate refs/t0")
	want(a, "Metal3Machine refs/m0")

	if err := machines.Delete(ctx, "m0", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	want(a)
	want(b, "Metal3MachineTemplate refs/t0")

	// Through oci:// (no checksum: Metal3 verifies the manifest's layer),
	// the template still keeps its image.
	if tmpl, err = templates.Get(ctx, "t0", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	_ = unstructured.SetNestedStringMap(tmpl.Object, map[string]string{"url": "oci://osimages:8443/images/" + a + "@sha256:" + b, "diskFormat": "raw"}, "spec", "template", "spec", "image")
	if _, err := templates.Update(ctx, tmpl, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	want(a, "Metal3MachineTemplate refs/t0")
	want(b)
}
