package controller

import (
	"context"
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/sylva-projects/osimages/internal/metal3"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/testenv"
)

// A capm3 installed after the controller started needs no restart: the
// check finds the Metal3 kinds while running, and reads the images the
// Metal3 objects reference.
func TestCheckSeesMetal3InstalledLater(t *testing.T) {
	k, installMetal3 := testenv.KubeWithoutMetal3(t)

	const label = "test-late-capm3/workload"
	const ns = "late-capm3"
	k.Namespace(t, ns, map[string]string{label: ""})
	putOn(t, k, ns, "served", nil, "capm3_os_image_server_images: {}\n")
	startManagerOn(t, k, Options{Check: &CheckOptions{
		Namespaces: labels.SelectorFromSet(labels.Set{label: ""}), ServedCopy: "served", Resync: time.Hour,
		DiscoveryInterval: 100 * time.Millisecond,
	}})
	statusOn := func() osimage.CheckReport {
		cm, err := k.Client.CoreV1().ConfigMaps(ns).Get(context.Background(), osimage.StatusConfigMapName, metav1.GetOptions{})
		if err != nil {
			return osimage.CheckReport{}
		}
		r, _ := osimage.ParseCheckReport(cm.Data[osimage.StatusKey])
		return r
	}
	testenv.Eventually(t, "the namespace checked without capm3", 30*time.Second, func() (bool, string) {
		r := statusOn()
		return r.ServedSetFound && len(r.Images) == 0, fmt.Sprint(r)
	})

	installMetal3()
	dyn, err := dynamic.NewForConfig(k.Config)
	if err != nil {
		t.Fatal(err)
	}
	sha := sum("late")
	machine := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": metal3.Group + "/v1beta2", "kind": metal3.KindMachine,
		"metadata": map[string]any{"name": "m0"},
		"spec": map[string]any{"image": map[string]any{
			"url": "http://osimages:8080/images/" + sha + "/late.raw", "checksum": sha, "checksumType": "sha256", "diskFormat": "raw"}},
	}}
	gvr := schema.GroupVersionResource{Group: metal3.Group, Version: "v1beta2", Resource: "metal3machines"}
	if _, err := dyn.Resource(gvr).Namespace(ns).Create(context.Background(), machine, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "the Metal3Machine's image reported not served", 60*time.Second, func() (bool, string) {
		p := statusOn().Problems()
		return len(p) == 1 && p[0].SHA256.String() == sha && p[0].State == osimage.StateNotServed &&
			len(p[0].NeededBy) == 1 && p[0].NeededBy[0] == "Metal3Machine "+ns+"/m0", fmt.Sprint(p)
	})
}
