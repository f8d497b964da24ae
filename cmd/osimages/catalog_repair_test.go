package main

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sylva-projects/osimages/internal/osimage"
)

// A hand edit of os-images-info that keeps the annotations is repaired:
// the inputs-hash still matched, so the catalog skipped, and the data
// stayed `os_images: {}`.
func TestCatalogApplyRepairsAHandEdit(t *testing.T) {
	k := apiserver(t)
	ctx := context.Background()
	ns := "catalog-repair"
	if _, err := k.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	reg, _, _ := countingRegistry(t, []string{"0.7.6"}, "ubuntu-noble-plain-rke2-1-32")
	v := writeFile(t, "values.yaml", catalogValues(reg, "ubuntu-noble-plain-rke2-1-32"))
	apply := func() result {
		return run(t, "catalog", "-f", v, "--apply", "--kubeconfig", k.Kubeconfig, "-n", ns)
	}
	if r := apply(); r.code != 0 {
		t.Fatalf("apply: exit %d, %s", r.code, r.stderr)
	}
	cms := k.Client.CoreV1().ConfigMaps(ns)
	cm, err := cms.Get(ctx, osimage.InfoConfigMapName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	good := cm.Data[osimage.ValuesKey]
	cm.Data[osimage.ValuesKey] = "os_images: {}\n"
	if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	r := apply()
	if r.code != 0 || strings.Contains(r.stderr, "up to date") {
		t.Fatalf("apply after a hand edit: exit %d, %s", r.code, r.stderr)
	}
	cm, err = cms.Get(ctx, osimage.InfoConfigMapName, metav1.GetOptions{})
	if err != nil || cm.Data[osimage.ValuesKey] != good {
		t.Errorf("the hand edit was not repaired: %v %v", cm.Data, err)
	}
	if r := apply(); r.code != 0 || !strings.Contains(r.stderr, "up to date") {
		t.Errorf("after the repair, the skip works again: exit %d, %s", r.code, r.stderr)
	}
}
