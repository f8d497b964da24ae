package controller

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sylva-projects/osimages/internal/fleet"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/testenv"
)

// The check publishes the fleet's needs in one ConfigMap of the
// management namespace, with the records of each namespace's own catalog,
// and follows the clusters: a new need appears, a need that goes leaves.
func TestFleetNeedsPublished(t *testing.T) {
	const label = "test-needs/workload"
	namespace(t, "needs-mgmt", nil)
	namespace(t, "needs-a", map[string]string{label: ""})
	namespace(t, "needs-b", map[string]string{label: ""})
	namespace(t, "needs-outside", nil)
	target := types.NamespacedName{Namespace: "needs-mgmt", Name: osimage.FleetNeedsConfigMapName}
	startManager(t, Options{Check: &CheckOptions{
		Namespaces: labels.SelectorFromSet(labels.Set{label: ""}), ServedCopy: "served", Resync: time.Hour, FleetNeeds: target,
	}})

	record := func(content, uri string) osimage.Image {
		return osimage.Image{"sha256": sum(content), "filename": content + ".raw", "image-format": "raw", "os": "ubuntu",
			"k8s-flavor": "rke2", "k8s-version": "1.32.5+rke2r1", "uri": uri}
	}
	catalog := func(key string, img osimage.Image) string {
		doc, err := osimage.MarshalInfo(osimage.Catalog{key: img})
		if err != nil {
			t.Fatal(err)
		}
		return string(doc)
	}
	// Two namespaces need one image under other keys and URIs; a third,
	// outside the selector, needs another and is not counted.
	put(t, "needs-a", "os-images-info", nil, catalog("ubuntu", record("u1", "oci://registry.example.org/dib/ubuntu:1")))
	put(t, "needs-b", "os-images-info", nil, catalog("ubuntu-n-1", record("u1", "oci://mirror.example.org/dib/ubuntu:1")))
	put(t, "needs-outside", "os-images-info", nil, catalog("ubuntu", record("other", "oci://registry.example.org/dib/other:1")))
	for _, ns := range []string{"needs-a", "needs-b", "needs-outside"} {
		put(t, ns, "values", map[string]string{fleet.ClusterValuesLabel: ""}, clusterValues)
		put(t, ns, "served", nil, "capm3_os_image_server_images: {}\n")
	}
	published := func() (osimage.FleetNeeds, string) {
		cm, err := suite.Kube(t).Client.CoreV1().ConfigMaps(target.Namespace).Get(context.Background(), target.Name, metav1.GetOptions{})
		if err != nil {
			return osimage.FleetNeeds{}, err.Error()
		}
		if _, ours := cm.Labels[osimage.FleetNeedsLabel]; !ours {
			return osimage.FleetNeeds{}, "no label"
		}
		f, _, err := osimage.ParseFleetNeeds(cm.Data[osimage.FleetNeedsKey])
		if err != nil {
			return osimage.FleetNeeds{}, err.Error()
		}
		return f, cm.Data[osimage.FleetNeedsKey]
	}
	testenv.Eventually(t, "the needs of needs-a and needs-b published", 30*time.Second, func() (bool, string) {
		f, doc := published()
		if len(f.Images) != 1 || f.Images[0].SHA256.String() != sum("u1") || strings.Join(f.Images[0].Namespaces, ",") != "needs-a,needs-b" || len(f.Images[0].Sources) != 2 {
			return false, doc
		}
		a, b := f.Images[0].Sources[0], f.Images[0].Sources[1]
		return a.Key == "ubuntu" && a.Image.Get("uri") == "oci://registry.example.org/dib/ubuntu:1" && strings.Join(a.Namespaces, ",") == "needs-a" &&
			b.Key == "ubuntu-n-1" && b.Image.Get("uri") == "oci://mirror.example.org/dib/ubuntu:1", doc
	})

	// needs-b moves to another image: the document follows.
	put(t, "needs-b", "os-images-info", nil, catalog("ubuntu-n-1", record("u2", "oci://mirror.example.org/dib/ubuntu:2")))
	testenv.Eventually(t, "needs-b's new image published, its old need gone", 30*time.Second, func() (bool, string) {
		f, doc := published()
		if len(f.Images) != 2 {
			return false, doc
		}
		byNS := map[string]string{}
		for _, img := range f.Images {
			byNS[strings.Join(img.Namespaces, ",")] = img.SHA256.String()
		}
		return byNS["needs-a"] == sum("u1") && byNS["needs-b"] == sum("u2"), doc
	})

	// A namespace that stops being a workload cluster's stops counting.
	ns, err := suite.Kube(t).Client.CoreV1().Namespaces().Get(context.Background(), "needs-b", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	delete(ns.Labels, label)
	if _, err := suite.Kube(t).Client.CoreV1().Namespaces().Update(context.Background(), ns, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "needs-b left out", 30*time.Second, func() (bool, string) {
		f, doc := published()
		return len(f.Images) == 1 && f.Images[0].SHA256.String() == sum("u1"), doc
	})
}

// A ConfigMap of that name that osimages did not make is left alone.
func TestFleetNeedsLeavesAForeignConfigMap(t *testing.T) {
	const label = "test-needs-foreign/workload"
	namespace(t, "needs-foreign-mgmt", nil)
	namespace(t, "needs-foreign-a", map[string]string{label: ""})
	put(t, "needs-foreign-mgmt", osimage.FleetNeedsConfigMapName, nil, "mine: true\n")
	target := types.NamespacedName{Namespace: "needs-foreign-mgmt", Name: osimage.FleetNeedsConfigMapName}
	log := &errorLog{}
	o := Options{Check: &CheckOptions{
		Namespaces: labels.SelectorFromSet(labels.Set{label: ""}), ServedCopy: "served", Resync: time.Hour, FleetNeeds: target,
	}}
	o.ManagerOptions.Logger = logr.New(log)
	startManager(t, o)
	put(t, "needs-foreign-a", "values", map[string]string{fleet.ClusterValuesLabel: ""}, clusterValues)
	testenv.Eventually(t, "the refusal logged", 30*time.Second, func() (bool, string) {
		n := log.count(func(l *errorLog) []string { return l.errors }, "the fleet's needs are not published: ConfigMap needs-foreign-mgmt/osimages-fleet-needs exists without the label "+osimage.FleetNeedsLabel)
		return n > 0, fmt.Sprint(log.errors)
	})
	cm, err := suite.Kube(t).Client.CoreV1().ConfigMaps(target.Namespace).Get(context.Background(), target.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]string{"values.yaml": "mine: true\n"}; fmt.Sprint(cm.Data) != fmt.Sprint(want) {
		t.Errorf("a user's ConfigMap was overwritten: %v", cm.Data)
	}
}
