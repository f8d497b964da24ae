package main

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/sylva-projects/osimages/internal/devregistry"
	"github.com/sylva-projects/osimages/internal/fleet"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/testenv"
)

// catalogInputsAt are sylva-units values of a workload cluster whose own
// catalog pins a diskimage-builder version of its own, under registry key
// regKey on the registry host.
func catalogInputsAt(host, regKey, version string) string {
	return catalogInputsUnder("oci://"+host+"/sylva-projects/sylva-elements/diskimage-builder", regKey, version)
}

// catalogInputsUnder is catalogInputsAt with the registry url url.
func catalogInputsUnder(url, regKey, version string) string {
	return fmt.Sprintf(`oci_registry_insecure: true
os_images_oci_registries:
  %s:
    url: %s
    tag: '%s'
sylva_diskimagebuilder_images:
  %s: {os_images_oci_registry: %s}
  %s: {os_images_oci_registry: %s}
`, regKey, url, version, img132, regKey, img131, regKey)
}

// addWorkload creates one more workload namespace of the chain, with its
// catalog inputs; its cluster values are the caller's to apply.
func (e *fleetEnv) addWorkload(ns, catalogInputs string) {
	e.t.Helper()
	e.k.Namespace(e.t, ns, map[string]string{e.label: ""})
	e.applyConfigMap(ns, "catalog", map[string]string{fleet.CatalogValuesLabel: ""}, catalogInputs)
}

func (e *fleetEnv) page(path string) string {
	e.t.Helper()
	resp, err := http.Get(e.serve.url(path))
	if err != nil {
		return err.Error()
	}
	return readAll(e.t, resp)
}

// TestFleetNeedsEndToEnd: the image server serves what the workload
// clusters need (--serve-fleet-needs), within policy, with no selector
// written for them; refusals reach the tenant's osimages-status.
func TestFleetNeedsEndToEnd(t *testing.T) {
	t.Run("on: served, refused by registry, refused by quota, collected", func(t *testing.T) {
		// A second registry that the management values do not declare,
		// which counts the blob downloads of its images.
		var undeclaredBlobs atomic.Int64
		other := testenv.Registry(t, devregistry.Options{Middleware: func(next http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/blobs/") {
					undeclaredBlobs.Add(1)
				}
				next.ServeHTTP(w, r)
			})
		}})
		e := newFleetWith(t, "fleet-needs", 700, nil, fleetArgs{
			serve: []string{"--serve-fleet-needs", "--fleet-needs-max-images-per-namespace", "1"},
			ctrl:  []string{"--fleet-needs", "fleet-needs-mgmt/" + osimage.FleetNeedsConfigMapName},
		})
		ctx := context.Background()

		// 1. wc4's own catalog pins the previous release under its own
		// registry key; nothing in the management values selects it.
		wc4 := "fleet-needs-wc4"
		old := e.published[img132+":0.7.6"]
		oldSHA := imageSHA(t, old)
		if _, served := e.servedIn(e.mgmtNS, fleetServedCM)[oldSHA]; served {
			t.Fatal("the fixture must not serve wc4's image before it is needed")
		}
		e.addWorkload(wc4, catalogInputsAt(e.reg.Host, "sylva-n-1", "0.7.6"))
		e.waitCatalog(wc4, img132, oldSHA)
		e.gate.hold(old.LayerDigest.String())
		values := e.clusterValues(wc4, "v1.32.5+rke2r1")
		start := time.Now()
		e.applyConfigMap(wc4, "cluster", map[string]string{fleet.ClusterValuesLabel: ""}, values)
		// Published while it downloads (available: false), then true.
		e.waitCopy(wc4, oldSHA, true, false)
		e.gate.release(old.LayerDigest.String())
		var r result
		testenv.Eventually(t, "render --apply of wc4 succeeds", 120*time.Second, func() (bool, string) {
			r = e.render(wc4, values)
			return r.code == 0, r.stderr
		})
		t.Logf("scenario 1: %.1fs from the cluster values appearing to render --apply succeeding (download held until the image was published unavailable)", time.Since(start).Seconds())
		filename := old.Fields.Get(osimage.FieldFilename)
		if got, code := sha256Of(t, e.serve.url("/images/"+oldSHA.String()+"/"+filename)); code != 200 || got != oldSHA.String() {
			t.Fatalf("the fleet-needed image is not served: HTTP %d, sha256 %s", code, got)
		}
		if mgmt := e.configMapDoc(e.mgmtNS, "mgmt-values"); strings.Contains(mgmt, oldSHA.String()) || strings.Contains(mgmt, "sylva-n-1") {
			t.Fatal("the management values name wc4's image: the test proves nothing")
		}

		// 3. wc2 moves to a registry the management values do not declare.
		// Both images of the catalog, as a catalog resolves every one.
		var undeclared devregistry.Published
		for i, img := range []string{img132, img131} {
			k8s := map[string]string{img132: "1.32.5+rke2r1", img131: "1.31.9+rke2r1"}[img]
			p, err := other.Publish(ctx, devregistry.DiskImage{
				Repository: dibRepo + img, Tag: "0.7.9", Gzip: true, Content: devregistry.DiskContent(256<<10, uint64(790+i)),
				Fields: osimage.Image{"os": "ubuntu", "os-release": "noble", "hardened": "false", "flavor": "plain",
					"k8s-flavor": "rke2", "k8s-version": k8s, "commit-tag": "0.7.9"},
			})
			if err != nil {
				t.Fatal(err)
			}
			undeclared = p
		}
		badSHA := imageSHA(t, undeclared)
		e.applyConfigMap(e.wc2, "catalog", map[string]string{fleet.CatalogValuesLabel: ""}, catalogInputsAt(other.Host, "elsewhere", "0.7.9"))
		e.waitCatalog(e.wc2, img131, badSHA)
		blobsBefore := undeclaredBlobs.Load()
		declared := "os_images_oci_registries: sylva (oci://" + e.reg.Host + "/sylva-projects/sylva-elements/diskimage-builder)"
		wantReason := "uri " + "oci://" + undeclared.Ref + " (record " + img131 + ") is under no registry url the management values declare (" + declared + ")"
		testenv.Eventually(t, "wc2's status gives the refusal", 60*time.Second, func() (bool, string) {
			probs := e.status(e.wc2).Problems()
			return len(probs) == 1 && probs[0].SHA256 == badSHA && probs[0].State == osimage.StateNotServed &&
				strings.Contains(probs[0].Message, wantReason), fmt.Sprint(probs)
		})
		testenv.Eventually(t, "Warning event in wc2 with the reason", 30*time.Second, func() (bool, string) {
			evs := e.namespaceEvents(e.wc2, "FleetNeedRefused")
			for _, ev := range evs {
				if strings.Contains(ev, wantReason) {
					return true, ""
				}
			}
			return false, fmt.Sprint(evs)
		})
		testenv.Eventually(t, "metric and status page", 30*time.Second, func() (bool, string) {
			metrics := e.page("/metrics")
			return strings.Contains(metrics, `osimages_fleet_needs_refused{namespace="`+e.wc2+`",reason="registry-not-allowed"} 1`) &&
				strings.Contains(e.page("/"), wantReason), grepLines(metrics, "fleet_needs")
		})
		if n := undeclaredBlobs.Load() - blobsBefore; n != 0 {
			t.Errorf("%d blobs were downloaded from the undeclared registry", n)
		}
		if strings.Contains(e.page("/"), `<tr class="" data-sha256="`+badSHA.String()) {
			t.Error("the refused image is selected on the server")
		}

		// 3b. wc2 moves to another repository of the declared registry's
		// host (issue 35, item 2): on a shared registry host that is
		// anyone's repository, which the declared registry's cosign key
		// does not cover. Refused, naming the need, the declared
		// registries and the fix; nothing is downloaded.
		var crossRepo devregistry.Published
		for i, img := range []string{img132, img131} {
			k8s := map[string]string{img132: "1.32.5+rke2r1", img131: "1.31.9+rke2r1"}[img]
			p, err := e.reg.Publish(ctx, devregistry.DiskImage{
				Repository: "someone-else/diskimage-builder/" + img, Tag: "0.7.9", Gzip: true, Content: devregistry.DiskContent(256<<10, uint64(890+i)),
				Fields: osimage.Image{"os": "ubuntu", "os-release": "noble", "hardened": "false", "flavor": "plain",
					"k8s-flavor": "rke2", "k8s-version": k8s, "commit-tag": "0.7.9"},
			})
			if err != nil {
				t.Fatal(err)
			}
			crossRepo = p
		}
		crossSHA := imageSHA(t, crossRepo)
		e.applyConfigMap(e.wc2, "catalog", map[string]string{fleet.CatalogValuesLabel: ""}, catalogInputsUnder("oci://"+e.reg.Host+"/someone-else/diskimage-builder", "elsewhere", "0.7.9"))
		e.waitCatalog(e.wc2, img131, crossSHA)
		crossReason := "uri " + "oci://" + crossRepo.Ref + " (record " + img131 + ") is under no registry url the management values declare (" + declared +
			"), and the image server pulls the fleet's needs only from under one, where its cosign key applies: publish the image under one of them, " +
			"or ask the operator to declare its repository in the management values' os_images_oci_registries"
		testenv.Eventually(t, "wc2's status refuses the other repository of the declared host", 60*time.Second, func() (bool, string) {
			probs := e.status(e.wc2).Problems()
			return len(probs) == 1 && probs[0].SHA256 == crossSHA && probs[0].State == osimage.StateNotServed &&
				strings.Contains(probs[0].Message, crossReason), fmt.Sprint(probs)
		})
		if n := e.gate.blobGets("someone-else/"); n != 0 {
			t.Errorf("%d blobs were downloaded from the other repository of the declared host", n)
		}
		if strings.Contains(e.page("/"), `<tr class="" data-sha256="`+crossSHA.String()) {
			t.Error("the cross-repository image is selected on the server")
		}

		// 4. wc3 needs two images beyond the management selection (a second
		// cluster on Kubernetes 1.31); its quota is one.
		e.applyConfigMap(e.wc3, "catalog", map[string]string{fleet.CatalogValuesLabel: ""}, catalogInputsAt(e.reg.Host, "sylva-next", "0.7.8"))
		e.waitCatalog(e.wc3, img132, e.sha(img132+":0.7.8"))
		e.applyConfigMap(e.wc3, "cluster-b", map[string]string{fleet.ClusterValuesLabel: ""}, e.clusterValues(e.wc3+"-b", "v1.31.9+rke2r1"))
		testenv.Eventually(t, "wc3: one need served, the other refused by quota", 90*time.Second, func() (bool, string) {
			r := e.status(e.wc3)
			served, quota := 0, 0
			for _, img := range r.Images {
				switch {
				case img.State == osimage.StateServed:
					served++
				case img.State == osimage.StateNotServed && strings.Contains(img.Message, "quota of 1 images reached"):
					quota++
				}
			}
			// Three needs: the templates rendered at 0.7.7 (served by the
			// management values, so not charged), and the two new ones.
			return len(r.Images) == 3 && served == 2 && quota == 1, fmt.Sprintf("%+v", r.Images)
		})

		// 5. wc4's need disappears: its cluster values go, and the image
		// stays served while its templates still need it; once they go
		// too, nothing needs it, and it is collected after the grace.
		if err := e.k.Client.CoreV1().ConfigMaps(wc4).Delete(ctx, "cluster", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, "wc4 still needs the image through its templates alone, served", 30*time.Second, func() (bool, string) {
			r := e.status(wc4)
			if len(r.Images) != 1 || r.Images[0].SHA256 != oldSHA || r.Images[0].State != osimage.StateServed {
				return false, fmt.Sprintf("%+v", r.Images)
			}
			for _, by := range r.Images[0].NeededBy {
				if !strings.HasPrefix(by, "Metal3MachineTemplate ") {
					return false, fmt.Sprint(r.Images[0].NeededBy)
				}
			}
			return true, ""
		})
		list, err := e.dyn.Resource(templatesGVR).Namespace(wc4).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, item := range list.Items {
			if err := e.dyn.Resource(templatesGVR).Namespace(wc4).Delete(ctx, item.GetName(), metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		e.waitCopy(wc4, oldSHA, false, false)
		testenv.Eventually(t, "the image is collected after the grace", 30*time.Second, func() (bool, string) {
			_, code := sha256Of(t, e.serve.url("/images/"+oldSHA.String()+"/"+filename))
			return code == 404, fmt.Sprint(code)
		})
	})

	// Two tenants against each other (issue 23, items 1 and 2): a tenant
	// writes its own os-images-info giving the victim's sha256 another
	// filename, under a key that sorts first, with a tag that does not
	// exist and a 600 KB multi-line field. The victim's image is served
	// all the same, at its own URL, and the tenant is told why its record
	// fails.
	t.Run("tenants against each other", func(t *testing.T) {
		e := newFleetWith(t, "fleet-tenants", 900, nil, fleetArgs{
			serve: []string{"--serve-fleet-needs"},
			ctrl:  []string{"--fleet-needs", "fleet-tenants-mgmt/" + osimage.FleetNeedsConfigMapName},
		})
		victim, evil := "fleet-tenants-wc4", "fleet-tenants-aaa"
		old := e.published[img132+":0.7.6"]
		sha := imageSHA(t, old)
		e.addWorkload(victim, catalogInputsAt(e.reg.Host, "sylva-n-1", "0.7.6"))
		e.waitCatalog(victim, img132, sha)
		good := e.catalogOf(victim)[img132]

		rec := good.Clone()
		rec[osimage.FieldURI] = strings.Replace(good.Get(osimage.FieldURI), ":0.7.6", ":does-not-exist", 1)
		delete(rec, osimage.FieldManifestDigest)
		rec[osimage.FieldFilename] = "evil.raw"
		rec["description"] = strings.Repeat("a line of a long description\n", 20_000)
		doc, err := yaml.Marshal(map[string]any{"os_images": map[string]any{"aaa": map[string]any(rec)}})
		if err != nil {
			t.Fatal(err)
		}
		e.k.Namespace(t, evil, map[string]string{e.label: ""})
		e.applyConfigMap(evil, osimage.InfoConfigMapName, nil, string(doc))
		e.applyConfigMap(evil, "cluster", map[string]string{fleet.ClusterValuesLabel: ""}, e.clusterValues(evil, "v1.32.5+rke2r1"))
		testenv.Eventually(t, "the tenant is told its own record fails", 90*time.Second, func() (bool, string) {
			probs := e.status(evil).Problems()
			return len(probs) == 1 && probs[0].SHA256 == sha && probs[0].State == osimage.StateNotAvailable &&
				strings.Contains(probs[0].Refused, "record aaa"), fmt.Sprintf("%+v", probs)
		})

		values := e.clusterValues(victim, "v1.32.5+rke2r1")
		e.applyConfigMap(victim, "cluster", map[string]string{fleet.ClusterValuesLabel: ""}, values)
		testenv.Eventually(t, "the victim's image is served at its own URL", 120*time.Second, func() (bool, string) {
			r := e.status(victim)
			return len(r.Images) == 1 && r.Images[0].State == osimage.StateServed, fmt.Sprintf("%+v", r.Images)
		})
		if got, code := sha256Of(t, e.serve.url("/images/"+sha.String()+"/"+good.Get(osimage.FieldFilename))); code != 200 || got != sha.String() {
			t.Fatalf("the victim's URL: HTTP %d, sha256 %s", code, got)
		}
		if r := e.render(victim, values); r.code != 0 {
			t.Fatalf("render --apply of the victim: exit %d\n%s", r.code, r.stderr)
		}
		cm, err := e.k.Client.CoreV1().ConfigMaps(e.mgmtNS).Get(context.Background(), osimage.FleetNeedsConfigMapName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if needs := cm.Data[osimage.FleetNeedsKey]; !strings.Contains(needs, "evil.raw") || strings.Contains(needs, "a long description") {
			t.Error("a field the server never reads is copied into the fleet's needs")
		}
	})

	t.Run("off: today's clear not-served status, nothing downloaded", func(t *testing.T) {
		e := newFleetWith(t, "fleet-needs-off", 800, nil, fleetArgs{
			ctrl: []string{"--fleet-needs", "fleet-needs-off-mgmt/" + osimage.FleetNeedsConfigMapName},
		})
		wc4 := "fleet-needs-off-wc4"
		old := e.published[img132+":0.7.6"]
		oldSHA := imageSHA(t, old)
		e.addWorkload(wc4, catalogInputsAt(e.reg.Host, "sylva-n-1", "0.7.6"))
		e.waitCatalog(wc4, img132, oldSHA)
		values := e.clusterValues(wc4, "v1.32.5+rke2r1")
		e.applyConfigMap(wc4, "cluster", map[string]string{fleet.ClusterValuesLabel: ""}, values)
		testenv.Eventually(t, "wc4 reports its image not served", 60*time.Second, func() (bool, string) {
			probs := e.status(wc4).Problems()
			return len(probs) == 1 && probs[0].SHA256 == oldSHA && probs[0].State == osimage.StateNotServed &&
				strings.Contains(probs[0].Message, "is currently not served by mgmt cluster os-image-server") &&
				!strings.Contains(probs[0].Message, "refuses"), fmt.Sprint(probs)
		})
		// The controller publishes the need all the same; the server,
		// without the option, does not read it.
		testenv.Eventually(t, "the need is published", 30*time.Second, func() (bool, string) {
			cm, err := e.k.Client.CoreV1().ConfigMaps(e.mgmtNS).Get(context.Background(), osimage.FleetNeedsConfigMapName, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			return strings.Contains(cm.Data[osimage.FleetNeedsKey], oldSHA.String()), cm.Data[osimage.FleetNeedsKey]
		})
		if r := e.render(wc4, values); r.code != 1 || !strings.Contains(r.stderr, "is currently not served") {
			t.Fatalf("render wc4: want exit 1, not served; got %d\n%s", r.code, r.stderr)
		}
		if strings.Contains(e.page("/"), oldSHA.String()) {
			t.Error("the server knows an image nobody selected")
		}

		// plan predicts what the option would do, per namespace.
		planArgs := []string{"plan", "-f", e.mgmtFile, "--kubeconfig", e.k.Kubeconfig, "--served-configmap", e.mgmtNS + "/" + fleetServedCM, "--namespace-selector", e.label}
		wc4Lines := func(r result) string {
			var out []string
			for _, line := range strings.Split(r.stdout, "\n") {
				if strings.HasPrefix(line, wc4+" ") {
					out = append(out, strings.TrimSpace(strings.TrimPrefix(line, wc4)))
				}
			}
			return strings.Join(out, "\n")
		}
		r := run(t, planArgs...)
		if got := wc4Lines(r); r.code != 1 || !strings.HasPrefix(got, "would fail: "+oldSHA.String()) {
			t.Errorf("plan without the option: exit %d, %q\n%s", r.code, got, r.stderr)
		}
		r = run(t, append(planArgs, "--serve-fleet-needs")...)
		if got := wc4Lines(r); r.code != 0 || got != "served for the fleet's needs: "+oldSHA.String()+"/"+img132 {
			t.Errorf("plan with the option: exit %d, %q\n%s%s", r.code, got, r.stdout, r.stderr)
		}
		r = run(t, append(planArgs, "--serve-fleet-needs", "--fleet-needs-max-bytes-per-namespace", "1")...)
		if got := wc4Lines(r); r.code != 1 || !strings.Contains(got, "serve --serve-fleet-needs would refuse it: quota of 1 bytes reached") {
			t.Errorf("plan with a quota: exit %d, %q\n%s", r.code, got, r.stderr)
		}
	})
}
