package propagate

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sylva-projects/osimages/internal/capm3"
	"github.com/sylva-projects/osimages/internal/fleet"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/values"
)

// putConfigMap creates or replaces the data and labels of ConfigMap
// ns/name.
func (e *env) putConfigMap(ns, name string, lbls, data map[string]string) {
	e.t.Helper()
	ctx := context.Background()
	cm := &corev1.ConfigMap{}
	err := e.c.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, cm)
	switch {
	case apierrors.IsNotFound(err):
		cm = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: lbls}, Data: data}
		err = e.c.Create(ctx, cm)
	case err == nil:
		cm.Labels, cm.Data = lbls, data
		err = e.c.Update(ctx, cm)
	}
	if err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) deleteConfigMap(ns, name string) {
	e.t.Helper()
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	if err := e.c.Delete(context.Background(), cm); err != nil {
		e.t.Fatal(err)
	}
}

// servedIn reads the copy in ns as render does (values.yaml, strictly).
func (e *env) servedIn(ns string) (osimage.ServedSet, error) {
	cp := e.getCopy(ns)
	if cp == nil {
		return nil, fmt.Errorf("no copy in %s", ns)
	}
	return osimage.ParseServed([]byte(cp.Data[osimage.ValuesKey]))
}

// waitServed waits until the copy in ns serves exactly the images names.
func (e *env) waitServed(ns string, names ...string) {
	e.t.Helper()
	want := shas(names...)
	eventually(e.t, settle, func() error {
		set, err := e.servedIn(ns)
		if err != nil {
			return err
		}
		if got := sortedSHA256s(set); !slices.Equal(got, want) {
			return fmt.Errorf("copy in %s serves %d images %v, want %v (%v)", ns, len(got), got, want, names)
		}
		return nil
	})
}

// renderCatalog is a cluster's own catalog: the two images that
// renderValues picks, described as the catalog does, and names (only a
// sha256 each).
func renderCatalog(t *testing.T, names ...string) string {
	t.Helper()
	c := osimage.Catalog{}
	for _, n := range names {
		c[n] = osimage.Image{osimage.FieldSHA256: string(digest(n)), osimage.FieldFilename: n + ".raw", osimage.FieldImageFormat: "raw"}
	}
	for _, hardened := range []string{"false", "true"} {
		n := "plain"
		if hardened == "true" {
			n = "hardened"
		}
		c[n] = osimage.Image{osimage.FieldSHA256: string(digest(n)), osimage.FieldFilename: n + ".raw", osimage.FieldImageFormat: "raw",
			osimage.FieldOS: "ubuntu", osimage.FieldHardened: hardened, osimage.FieldK8sFlavor: "rke2", osimage.FieldK8sVersion: "1.32.5+rke2r1",
			osimage.FieldRegistryKey: "sylva"}
	}
	doc, err := osimage.MarshalInfo(c)
	if err != nil {
		t.Fatal(err)
	}
	return string(doc)
}

// renderValues are a cluster's values whose control plane picks "plain"
// and whose machine deployment picks "hardened" from renderCatalog.
const renderValues = `name: wc
k8s_version: v1.32.5+rke2r1
capi_providers: {infra_provider: capm3, bootstrap_provider: cabpr}
capm3:
  os_image_selector: {os: ubuntu, hardened: false}
  image_provisioning_host: 192.0.2.10
machine_deployments:
  md0:
    capm3:
      os_image_selector: {hardened: true}
`

// render renders renderValues in ns as `osimages render` does with
// --os-images-configmap and --served-configmap: (A) from the namespace's
// catalog, (B) from its copy's values.yaml.
func (e *env) render(ns string) ([]capm3.Template, error) {
	e.t.Helper()
	cat := &corev1.ConfigMap{}
	if err := e.c.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: osimage.InfoConfigMapName}, cat); err != nil {
		e.t.Fatal(err)
	}
	info, err := osimage.ParseInfo([]byte(cat.Data[osimage.ValuesKey]))
	if err != nil {
		e.t.Fatal(err)
	}
	v, err := values.Parse([]byte(renderValues))
	if err != nil {
		e.t.Fatal(err)
	}
	a, err := osimage.MergeA(info, v)
	if err != nil {
		e.t.Fatal(err)
	}
	b, err := e.servedIn(ns)
	if err != nil {
		e.t.Fatal(err)
	}
	return capm3.Render(capm3.Input{Values: v, Catalog: a, Served: b, Namespace: ns})
}

// check runs the fleet check of ns as the controller does: fleet.Read of
// the namespace, its needs, compared with its copy.
func (e *env) check(ns string) osimage.CheckReport {
	e.t.Helper()
	read, err := fleet.Read(context.Background(), e.c, ns, fleet.ReadOptions{ServedCopy: e.rule.Target})
	if err != nil {
		e.t.Fatal(err)
	}
	needs, needErr := fleet.Needs(read.Inputs)
	return fleet.Check(ns, e.rule.Target, needs, read.Served, read.ServedFound, needErr)
}

// TestCopiesCarryWhatTheirNamespaceCanUse: each copy holds the served
// entries its namespace's catalog names and follows that catalog; render
// and the fleet check read it as they read a whole copy.
func TestCopiesCarryWhatTheirNamespaceCanUse(t *testing.T) {
	e := newEnv(t)
	e.rule.Catalog = osimage.InfoConfigMapName
	src := servedData(t, []string{"plain", "hardened", "a", "b", "c", "d"}, osimage.RefusedNeeds{
		{SHA256: digest("x"), Namespace: e.ns("cat-two"), Reason: osimage.RefusedRegistry, Message: "x comes from a registry the management values do not declare"},
	})
	e.putConfigMap(e.rule.Source.Namespace, e.rule.Source.Name, nil, src)
	one, two, none, bad := e.ns("cat-one"), e.ns("cat-two"), e.ns("cat-none"), e.ns("cat-bad")
	for _, ns := range []string{one, two, none, bad} {
		e.createNamespace(ns, true)
	}
	info := func(doc string) map[string]string { return map[string]string{osimage.ValuesKey: doc} }
	e.putConfigMap(one, osimage.InfoConfigMapName, nil, info(renderCatalog(t, "a")))
	// Two namespaces, two catalogs; two's names x, which is not served.
	e.putConfigMap(two, osimage.InfoConfigMapName, nil, info(catalogDoc(t, "c", "x")))
	e.putConfigMap(bad, osimage.InfoConfigMapName, nil, info("os_images: ["))
	for _, ns := range []string{one, two} {
		e.putConfigMap(ns, "cluster", map[string]string{fleet.ClusterValuesLabel: ""}, info(renderValues))
	}
	e.start(Options{})

	e.waitServed(one, "plain", "hardened", "a")
	e.waitServed(two, "c")
	e.waitServed(none)
	e.waitServed(bad)

	t.Run("render and the check read a filtered copy as they read a whole one", func(t *testing.T) {
		templates, err := e.render(one)
		if err != nil {
			t.Fatalf("render against the filtered copy: %v", err)
		}
		if len(templates) != 2 {
			t.Errorf("%d templates, want 2", len(templates))
		}
		report := e.check(one)
		if len(report.Images) != 2 || report.Count(osimage.StateServed) != 2 || len(report.Errors) != 0 {
			t.Errorf("check: %+v", report)
		}
		cp := e.getCopy(one)
		if cp.Data[osimage.ServedFilenamesKey] == "" || !strings.Contains(cp.Annotations[AnnotationPicks], "3 served entries kept") {
			t.Errorf("copy: data keys %v, annotations %v", cp.Data, cp.Annotations)
		}
		// The other namespace's refusal stays out of this copy.
		if _, ok := cp.Data[osimage.RefusedNeedsKey]; ok {
			t.Errorf("%s's copy carries refusals: %s", one, cp.Data[osimage.RefusedNeedsKey])
		}
	})

	t.Run("a second namespace: its own picks, its own refusals", func(t *testing.T) {
		// two's catalog holds no image renderValues can pick from; once
		// it does, they reach two's copy.
		e.putConfigMap(two, osimage.InfoConfigMapName, nil, info(renderCatalog(t, "c", "x")))
		e.waitServed(two, "plain", "hardened", "c")
		if _, err := e.render(two); err != nil {
			t.Fatalf("render: %v", err)
		}
		report := e.check(two)
		if report.Count(osimage.StateServed) != 2 {
			t.Errorf("check: %+v", report)
		}
		refused, _ := osimage.ParseRefusedNeeds([]byte(e.getCopy(two).Data[osimage.RefusedNeedsKey]))
		if len(refused) != 1 || refused[0].SHA256 != digest("x") {
			t.Errorf("two's refusals: %+v", refused)
		}
	})

	t.Run("a catalog that cannot be read: no entry, an event", func(t *testing.T) {
		cp := e.getCopy(bad)
		if !strings.Contains(cp.Annotations[AnnotationPicks], "ConfigMap os-images-info cannot be read") {
			t.Errorf("annotation %q", cp.Annotations[AnnotationPicks])
		}
		eventually(t, settle, func() error {
			evs := e.events(bad, "ConfigMap", e.rule.Target)["CatalogUnreadable"]
			if len(evs) == 0 {
				return fmt.Errorf("no CatalogUnreadable event")
			}
			if !strings.Contains(evs[0].Note, "renders in this namespace fail") {
				return fmt.Errorf("note %q", evs[0].Note)
			}
			return nil
		})
		e.putConfigMap(bad, osimage.InfoConfigMapName, nil, info(catalogDoc(t, "b")))
		e.waitServed(bad, "b")
	})

	t.Run("a catalog changed, created, deleted: the copy follows", func(t *testing.T) {
		e.putConfigMap(one, osimage.InfoConfigMapName, nil, info(renderCatalog(t, "b", "d")))
		e.waitServed(one, "plain", "hardened", "b", "d")
		e.putConfigMap(none, osimage.InfoConfigMapName, nil, info(catalogDoc(t, "a")))
		e.waitServed(none, "a")
		e.deleteConfigMap(two, osimage.InfoConfigMapName)
		e.waitServed(two)
		// Without a catalog, render has nothing to pick from, and the
		// check finds the clusters' levels cannot pick.
		if report := e.check(two); len(report.Errors) == 0 {
			t.Errorf("check of a namespace without its catalog: %+v", report)
		}
	})

	t.Run("the source changes: each copy takes what it keeps of it; a pick no longer served fails loudly", func(t *testing.T) {
		changed := servedData(t, []string{"plain", "a", "c", "d"}, nil)
		set, _ := osimage.ParseServed([]byte(changed[osimage.ValuesKey]))
		set[digest("d")] = osimage.ServedImage{Available: false, ImageKey: "mgmt-d"}
		doc, err := osimage.MarshalServed(set)
		if err != nil {
			t.Fatal(err)
		}
		changed[osimage.ValuesKey] = string(doc)
		e.putConfigMap(e.rule.Source.Namespace, e.rule.Source.Name, nil, changed)
		e.waitServed(one, "plain", "d") // neither b nor hardened is served
		e.waitServed(bad)
		e.waitServed(none, "a")
		eventually(t, settle, func() error {
			set, err := e.servedIn(one)
			if err != nil {
				return err
			}
			if set[digest("d")].Available {
				return fmt.Errorf("d still available in %s", one)
			}
			return nil
		})
		_, err = e.render(one)
		if want := "image " + string(digest("hardened")) + "/hardened is currently not served by mgmt cluster os-image-server"; err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("render: %v, want %q", err, want)
		}
		report := e.check(one)
		if report.Count(osimage.StateNotServed) != 1 || report.Count(osimage.StateServed) != 1 {
			t.Errorf("check: %+v", report)
		}
	})
}

// TestCopiesOfAVeryLargeCatalog: a catalog as large as a ConfigMap holds
// gives a copy of the few served entries it names, and other namespaces'
// copies are unaffected.
func TestCopiesOfAVeryLargeCatalog(t *testing.T) {
	e := newEnv(t)
	e.rule.Catalog = osimage.InfoConfigMapName
	e.putConfigMap(e.rule.Source.Namespace, e.rule.Source.Name, nil, servedData(t, []string{"img-7", "img-5999", "small"}, nil))
	big, small := e.ns("big"), e.ns("small")
	e.createNamespace(big, true)
	e.createNamespace(small, true)
	var names []string
	for i := range 6000 {
		names = append(names, fmt.Sprintf("img-%d", i))
	}
	doc := catalogDoc(t, names...)
	t.Logf("catalog of %d images, %d KiB", len(names), len(doc)>>10)
	e.putConfigMap(big, osimage.InfoConfigMapName, nil, map[string]string{osimage.ValuesKey: doc})
	e.putConfigMap(small, osimage.InfoConfigMapName, nil, map[string]string{osimage.ValuesKey: catalogDoc(t, "small")})
	e.start(Options{})
	e.waitServed(big, "img-7", "img-5999")
	e.waitServed(small, "small")
	if cp := e.getCopy(big); len(cp.Data[osimage.ValuesKey]) > 512 {
		t.Errorf("copy of %d bytes for two entries", len(cp.Data[osimage.ValuesKey]))
	}
}

// TestCopiesKeepWhatTheCheckFoundNeeded: an image a template still uses,
// though the catalog no longer names it, stays in the copy while
// osimages-status lists it.
func TestCopiesKeepWhatTheCheckFoundNeeded(t *testing.T) {
	e := newEnv(t)
	e.rule.Catalog = osimage.InfoConfigMapName
	e.putConfigMap(e.rule.Source.Namespace, e.rule.Source.Name, nil, servedData(t, []string{"old", "new"}, nil))
	ns := e.ns("needs")
	e.createNamespace(ns, true)
	e.putConfigMap(ns, osimage.InfoConfigMapName, nil, map[string]string{osimage.ValuesKey: catalogDoc(t, "new")})
	e.start(Options{})
	e.waitServed(ns, "new")

	status := statusConfigMap(t, osimage.CheckReport{Namespace: ns, Images: []osimage.ImageStatus{
		{SHA256: digest("old"), State: osimage.StateServed, NeededBy: []string{"Metal3MachineTemplate " + ns + "/wc-cp-1"}},
	}})
	e.putConfigMap(ns, status.Name, status.Labels, status.Data)
	e.waitServed(ns, "new", "old")
	e.deleteConfigMap(ns, status.Name)
	e.waitServed(ns, "new")
}
