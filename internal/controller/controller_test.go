package controller

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/sylva-projects/osimages/internal/devregistry"
	"github.com/sylva-projects/osimages/internal/fleet"
	"github.com/sylva-projects/osimages/internal/oci"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/signature"
	"github.com/sylva-projects/osimages/internal/testenv"
)

func sum(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}

// startManager runs the controller in-process until the test ends, and
// returns the registry of its metrics.
func startManager(t testing.TB, o Options) *prometheus.Registry {
	t.Helper()
	return startManagerOn(t, suite.Kube(t), o)
}

// startManagerOn is startManager on an apiserver of the test's own.
func startManagerOn(t testing.TB, k *testenv.Kube, o Options) *prometheus.Registry {
	t.Helper()
	reg := prometheus.NewRegistry()
	o.Registerer = reg
	if o.ManagerOptions.Logger.GetSink() == nil {
		o.ManagerOptions.Logger = logr.Discard()
	}
	mgr, err := NewManager(k.Config, o)
	if err != nil {
		t.Fatal(err)
	}
	testenv.StartManager(t, mgr)
	return reg
}

func put(t *testing.T, ns, name string, labels map[string]string, doc string) {
	t.Helper()
	putOn(t, suite.Kube(t), ns, name, labels, doc)
}

// putOn creates or updates ConfigMap NS/NAME with one values.yaml.
func putOn(t *testing.T, k *testenv.Kube, ns, name string, labels map[string]string, doc string) {
	t.Helper()
	ctx := context.Background()
	cms := k.Client.CoreV1().ConfigMaps(ns)
	cm, err := cms.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		cm = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels}, Data: map[string]string{"values.yaml": doc}}
		_, err = cms.Create(ctx, cm, metav1.CreateOptions{})
	} else {
		cm.Data = map[string]string{"values.yaml": doc}
		cm.Annotations = map[string]string{"touched": time.Now().String()}
		_, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
	}
	if err != nil {
		t.Fatal(err)
	}
}

func namespace(t *testing.T, name string, labels map[string]string) {
	t.Helper()
	if _, err := suite.Kube(t).Client.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func eventNotes(t *testing.T, ns, reason string) []string {
	t.Helper()
	list, err := suite.Kube(t).Client.EventsV1().Events(ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range list.Items {
		if e.Reason == reason {
			n := int32(1)
			if e.Series != nil {
				n = e.Series.Count
			}
			out = append(out, fmt.Sprintf("%s (x%d)", e.Note, n))
		}
	}
	return out
}

func status(t testing.TB, ns string) osimage.CheckReport {
	cm, err := suite.Kube(t).Client.CoreV1().ConfigMaps(ns).Get(context.Background(), osimage.StatusConfigMapName, metav1.GetOptions{})
	if err != nil {
		return osimage.CheckReport{}
	}
	r, _ := osimage.ParseCheckReport(cm.Data[osimage.StatusKey])
	return r
}

const clusterValues = `name: c1
k8s_version: v1.32.5+rke2r1
capi_providers: {infra_provider: capm3, bootstrap_provider: cabpr}
capm3: {os_image_selector: {os: ubuntu}}
`

func TestCheckWarnsOncePerChange(t *testing.T) {
	const label = "test-check/workload"
	namespace(t, "check-a", map[string]string{label: ""})
	namespace(t, "check-ignored", nil)
	// The check logs each warning as it emits it, within the reconcile.
	log := &errorLog{}
	o := Options{Check: &CheckOptions{Namespaces: labels.SelectorFromSet(labels.Set{label: ""}), ServedCopy: "served", Resync: time.Hour}}
	o.ManagerOptions.Logger = logr.New(log)
	startManager(t, o)
	warnedNotServed := func() int {
		return log.count(func(l *errorLog) []string { return l.infos }, "needed image not served[namespace check-a sha256 "+sum("u")+" state not-served ")
	}

	info, err := osimage.MarshalInfo(osimage.Catalog{"ubuntu": {"sha256": sum("u"), "filename": "u.raw", "image-format": "raw", "os": "ubuntu",
		"k8s-flavor": "rke2", "k8s-version": "1.32.5+rke2r1"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{"check-a", "check-ignored"} {
		put(t, ns, "os-images-info", nil, string(info))
		put(t, ns, "values", map[string]string{fleet.ClusterValuesLabel: ""}, clusterValues)
		put(t, ns, "served", nil, "capm3_os_image_server_images: {}\n")
	}
	testenv.Eventually(t, "not-served reported", 30*time.Second, func() (bool, string) {
		p := status(t, "check-a").Problems()
		return len(p) == 1 && p[0].State == osimage.StateNotServed && p[0].NeededBy[0] == "ConfigMap check-a/values .control_plane.capm3", fmt.Sprint(status(t, "check-a"))
	})
	testenv.Eventually(t, "one ImageNotServed event", 30*time.Second, func() (bool, string) {
		evs := eventNotes(t, "check-a", "ImageNotServed")
		return len(evs) == 1 && strings.Contains(evs[0], "image "+sum("u")+"/ubuntu is currently not served by mgmt cluster os-image-server; needed by ConfigMap check-a/values .control_plane.capm3"), fmt.Sprint(evs)
	})

	testenv.Eventually(t, "the warning logged", 30*time.Second, func() (bool, string) {
		n := warnedNotServed()
		return n == 1, fmt.Sprint(n, " warnings")
	})

	// Events that change nothing in what is missing (a touched input, the
	// same values in a second ConfigMap) raise no new warning. The status
	// naming the second ConfigMap shows that the check decided after them.
	put(t, "check-a", "values", nil, clusterValues)
	put(t, "check-a", "values-again", map[string]string{fleet.ClusterValuesLabel: ""}, clusterValues)
	testenv.Eventually(t, "the second ConfigMap of values read", 30*time.Second, func() (bool, string) {
		p := status(t, "check-a").Problems()
		return len(p) == 1 && slices.Contains(p[0].NeededBy, "ConfigMap check-a/values-again .control_plane.capm3"), fmt.Sprint(p)
	})

	// Served but still downloading, then available.
	put(t, "check-a", "served", nil, "capm3_os_image_server_images:\n  "+sum("u")+": {available: false, image_key: m}\n")
	testenv.Eventually(t, "not-available reported", 30*time.Second, func() (bool, string) {
		p := status(t, "check-a").Problems()
		return len(p) == 1 && p[0].State == osimage.StateNotAvailable, fmt.Sprint(p)
	})
	// A namespace is reconciled by one worker at a time: the reconciles
	// that read the unchanged inputs have returned, and logged any warning.
	if n := warnedNotServed(); n != 1 {
		t.Errorf("a reconcile without change warned again: %d warnings", n)
	}
	if evs := eventNotes(t, "check-a", "ImageNotServed"); len(evs) != 1 || !strings.HasSuffix(evs[0], "(x1)") {
		t.Errorf("a reconcile without change warned again: %v", evs)
	}
	testenv.Eventually(t, "ImageNotAvailable event", 30*time.Second, func() (bool, string) {
		evs := eventNotes(t, "check-a", "ImageNotAvailable")
		return len(evs) == 1, fmt.Sprint(evs)
	})
	put(t, "check-a", "served", nil, "capm3_os_image_server_images:\n  "+sum("u")+": {available: true, image_key: m}\n")
	testenv.Eventually(t, "all served", 30*time.Second, func() (bool, string) {
		r := status(t, "check-a")
		return len(r.Images) == 1 && len(r.Problems()) == 0, fmt.Sprint(r)
	})
	testenv.Eventually(t, "ImagesServed event", 30*time.Second, func() (bool, string) {
		evs := eventNotes(t, "check-a", "ImagesServed")
		return len(evs) == 1, fmt.Sprint(evs)
	})

	if _, err := suite.Kube(t).Client.CoreV1().ConfigMaps("check-ignored").Get(context.Background(), osimage.StatusConfigMapName, metav1.GetOptions{}); err == nil {
		t.Error("a namespace outside the selector was checked")
	}
}

func TestCatalogPublishesAndRetries(t *testing.T) {
	reg := testenv.Registry(t, devregistry.Options{})
	namespace(t, "catalog-a", nil)
	client, err := oci.NewClient(oci.Options{Insecure: true})
	if err != nil {
		t.Fatal(err)
	}
	readRegistry := Registry{Manifests: client, Signatures: signature.Verifier{Client: client}}
	startManager(t, Options{Catalog: &CatalogOptions{Secure: readRegistry, Insecure: readRegistry, Timeout: 5 * time.Second, RetryBase: 200 * time.Millisecond}})

	values := fmt.Sprintf(`oci_registry_insecure: true
os_images_oci_registries:
  sylva: {url: 'oci://%s/dib', tag: '1.0'}
sylva_diskimagebuilder_images:
  ubuntu: {os_images_oci_registry: sylva}
`, reg.Host)
	put(t, "catalog-a", "inputs", map[string]string{fleet.CatalogValuesLabel: ""}, values)
	testenv.Eventually(t, "CatalogFailed event for the missing tag", 30*time.Second, func() (bool, string) {
		evs := eventNotes(t, "catalog-a", "CatalogFailed")
		return len(evs) > 0 && strings.Contains(evs[0], "ubuntu"), fmt.Sprint(evs)
	})
	if _, err := suite.Kube(t).Client.CoreV1().ConfigMaps("catalog-a").Get(context.Background(), "os-images-info", metav1.GetOptions{}); err == nil {
		t.Fatal("os-images-info published although an image failed")
	}

	// The artifact appears: the retry publishes it.
	p, err := reg.Publish(context.Background(), devregistry.DiskImage{Repository: "dib/ubuntu", Tag: "1.0", Content: []byte("disk"), Fields: osimage.Image{"os": "ubuntu"}})
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "os-images-info published", 30*time.Second, func() (bool, string) {
		cm, err := suite.Kube(t).Client.CoreV1().ConfigMaps("catalog-a").Get(context.Background(), "os-images-info", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		cat, err := osimage.ParseInfo([]byte(cm.Data["values.yaml"]))
		return err == nil && cat["ubuntu"]["sha256"] == p.Fields.Get("sha256") && cm.Annotations["osimages.sylva-project.org/inputs-hash"] != "", fmt.Sprint(cat, err)
	})

	// Bad values: reported, nothing retried, os-images-info left as is.
	put(t, "catalog-a", "inputs", nil, "sylva_diskimagebuilder_images:\n  ubuntu: {os_images_oci_registry: nowhere}\n")
	testenv.Eventually(t, "CatalogValuesInvalid event", 30*time.Second, func() (bool, string) {
		evs := eventNotes(t, "catalog-a", "CatalogValuesInvalid")
		return len(evs) == 1 && strings.Contains(evs[0], "('nowhere') is not defined in os_images_oci_registries"), fmt.Sprint(evs)
	})
	cm, err := suite.Kube(t).Client.CoreV1().ConfigMaps("catalog-a").Get(context.Background(), "os-images-info", metav1.GetOptions{})
	if err != nil || !strings.Contains(cm.Data["values.yaml"], p.Fields.Get("sha256")) {
		t.Errorf("os-images-info changed on bad values: %v %v", cm, err)
	}
}

func TestCatalogVerifiesSignatures(t *testing.T) {
	reg := testenv.Registry(t, devregistry.Options{})
	namespace(t, "catalog-signed", nil)
	client, err := oci.NewClient(oci.Options{Insecure: true})
	if err != nil {
		t.Fatal(err)
	}
	readRegistry := Registry{Manifests: client, Signatures: signature.Verifier{Client: client}}
	startManager(t, Options{Catalog: &CatalogOptions{Secure: readRegistry, Insecure: readRegistry, Timeout: 5 * time.Second, RetryBase: 200 * time.Millisecond}})

	signer := testenv.Signer(t)
	p, err := reg.Publish(context.Background(), devregistry.DiskImage{Repository: "dib/ubuntu", Tag: "1.0", Content: []byte("disk"), Fields: osimage.Image{"os": "ubuntu"}})
	if err != nil {
		t.Fatal(err)
	}
	key := strings.ReplaceAll(strings.TrimSpace(signer.PublicKeyPEM), "\n", "\n      ")
	put(t, "catalog-signed", "inputs", map[string]string{fleet.CatalogValuesLabel: ""}, fmt.Sprintf(`oci_registry_insecure: true
os_images_oci_registries:
  sylva:
    url: 'oci://%s/dib'
    tag: '1.0'
    cosign_publickey: |
      %s
sylva_diskimagebuilder_images:
  ubuntu: {os_images_oci_registry: sylva}
`, reg.Host, key))
	testenv.Eventually(t, "unsigned artifact refused", 30*time.Second, func() (bool, string) {
		evs := eventNotes(t, "catalog-signed", "CatalogFailed")
		return len(evs) > 0 && strings.Contains(evs[0], "Invalid signature for oci://"+p.Ref), fmt.Sprint(evs)
	})
	testenv.Sign(t, reg, signer, p, devregistry.SignOptions{})
	testenv.Eventually(t, "signed artifact published with its digest", 30*time.Second, func() (bool, string) {
		cm, err := suite.Kube(t).Client.CoreV1().ConfigMaps("catalog-signed").Get(context.Background(), "os-images-info", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		cat, err := osimage.ParseInfo([]byte(cm.Data["values.yaml"]))
		return err == nil && cat["ubuntu"]["oci-manifest-digest"] == p.ManifestDigest.String(), fmt.Sprint(cat, err)
	})
}
