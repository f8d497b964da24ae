package controller

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/sylva-projects/osimages/internal/devregistry"
	"github.com/sylva-projects/osimages/internal/fleet"
	"github.com/sylva-projects/osimages/internal/oci"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/signature"
	"github.com/sylva-projects/osimages/internal/testenv"
)

// A user's own osimages-status, made before the namespace was labelled,
// is never overwritten, by the check or the catalog: an event says why.
func TestUsersOwnStatusIsNotOverwritten(t *testing.T) {
	const label = "test-owned/workload"
	reg := testenv.Registry(t, devregistry.Options{})
	if _, err := reg.Publish(context.Background(), devregistry.DiskImage{Repository: "dib/ubuntu", Tag: "1.0", Content: []byte("disk"), Fields: osimage.Image{"os": "ubuntu"}}); err != nil {
		t.Fatal(err)
	}
	client, err := oci.NewClient(oci.Options{Insecure: true})
	if err != nil {
		t.Fatal(err)
	}
	readRegistry := Registry{Manifests: client, Signatures: signature.Verifier{Client: client}}
	namespace(t, "owned-status", nil)
	put(t, "owned-status", osimage.StatusConfigMapName, nil, "mine: true\n")
	startManager(t, Options{
		Check:   &CheckOptions{Namespaces: labels.SelectorFromSet(labels.Set{label: ""}), ServedCopy: "served", Resync: time.Hour},
		Catalog: &CatalogOptions{Secure: readRegistry, Insecure: readRegistry},
	})
	put(t, "owned-status", "values", map[string]string{fleet.ClusterValuesLabel: ""}, clusterValues)
	put(t, "owned-status", "inputs", map[string]string{fleet.CatalogValuesLabel: ""},
		fmt.Sprintf("oci_registry_insecure: true\nos_images_oci_registries:\n  sylva: {url: 'oci://%s/dib', tag: '1.0'}\nsylva_diskimagebuilder_images:\n  ubuntu: {os_images_oci_registry: sylva}\n", reg.Host))
	ns, err := suite.Kube(t).Client.CoreV1().Namespaces().Get(context.Background(), "owned-status", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ns.Labels = map[string]string{label: ""}
	if _, err := suite.Kube(t).Client.CoreV1().Namespaces().Update(context.Background(), ns, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "StatusNameTaken events from the check and the catalog", 30*time.Second, func() (bool, string) {
		evs := eventNotes(t, "owned-status", string(reasonStatusNameTaken))
		return len(evs) >= 2 && strings.Contains(evs[0], "not created by osimages"), fmt.Sprint(evs)
	})
	testenv.Eventually(t, "the catalog is published all the same", 30*time.Second, func() (bool, string) { return published(t, "owned-status"), "" })
	cm, err := suite.Kube(t).Client.CoreV1().ConfigMaps("owned-status").Get(context.Background(), osimage.StatusConfigMapName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, labelled := cm.Labels[osimage.StatusLabel]; labelled || len(cm.Data) != 1 || cm.Data["values.yaml"] != "mine: true\n" {
		t.Errorf("the user's osimages-status was written: %v %v", cm.Labels, cm.Data)
	}
}

// A hand edit of os-images-info that keeps the annotations is repaired.
func TestCatalogRepairsAHandEdit(t *testing.T) {
	reg := testenv.Registry(t, devregistry.Options{})
	if _, err := reg.Publish(context.Background(), devregistry.DiskImage{Repository: "dib/ubuntu", Tag: "1.0", Content: []byte("disk"), Fields: osimage.Image{"os": "ubuntu"}}); err != nil {
		t.Fatal(err)
	}
	client, err := oci.NewClient(oci.Options{Insecure: true})
	if err != nil {
		t.Fatal(err)
	}
	readRegistry := Registry{Manifests: client, Signatures: signature.Verifier{Client: client}}
	namespace(t, "catalog-edited", nil)
	startManager(t, Options{Catalog: &CatalogOptions{Secure: readRegistry, Insecure: readRegistry}})
	put(t, "catalog-edited", "inputs", map[string]string{fleet.CatalogValuesLabel: ""},
		fmt.Sprintf("oci_registry_insecure: true\nos_images_oci_registries:\n  sylva: {url: 'oci://%s/dib', tag: '1.0'}\nsylva_diskimagebuilder_images:\n  ubuntu: {os_images_oci_registry: sylva}\n", reg.Host))
	testenv.Eventually(t, "published", 30*time.Second, func() (bool, string) { return published(t, "catalog-edited"), "" })
	cms := suite.Kube(t).Client.CoreV1().ConfigMaps("catalog-edited")
	cm, err := cms.Get(context.Background(), osimage.InfoConfigMapName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cm.Data[osimage.ValuesKey] = "os_images: {}\n"
	if _, err := cms.Update(context.Background(), cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "the hand edit repaired", 30*time.Second, func() (bool, string) { return published(t, "catalog-edited"), "" })
}

// errorLog records what a manager logs at ERROR.
type errorLog struct {
	mu     sync.Mutex
	errors []string
	infos  []string
}

func (l *errorLog) Init(logr.RuntimeInfo)  {}
func (l *errorLog) Enabled(level int) bool { return level <= 1 }
func (l *errorLog) Info(_ int, msg string, kv ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.infos = append(l.infos, fmt.Sprint(msg, kv))
}
func (l *errorLog) Error(err error, msg string, kv ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.errors = append(l.errors, fmt.Sprint(msg, ": ", err, kv))
}
func (l *errorLog) WithValues(...any) logr.LogSink { return l }
func (l *errorLog) WithName(string) logr.LogSink   { return l }

func (l *errorLog) count(lines func(*errorLog) []string, words ...string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, line := range lines(l) {
		for _, w := range words {
			if strings.Contains(line, w) {
				n++
				break
			}
		}
	}
	return n
}

// Writes refused because the cache was behind (a conflict, an object
// created meanwhile) are retried, and are not errors: 461 such ERROR lines
// were logged while creating 2,000 namespaces.
func TestRetriedConflictsAreNotErrors(t *testing.T) {
	const label = "test-conflicts/workload"
	const n = 20
	log := &errorLog{}
	o := Options{Check: &CheckOptions{Namespaces: labels.SelectorFromSet(labels.Set{label: ""}), ServedCopy: "served", Resync: time.Hour}}
	o.ManagerOptions.Logger = logr.New(log)
	startManager(t, o)
	info, err := osimage.MarshalInfo(osimage.Catalog{"ubuntu": {"sha256": sum("u"), "filename": "u.raw", "image-format": "raw", "os": "ubuntu",
		"k8s-flavor": "rke2", "k8s-version": "1.32.5+rke2r1"}})
	if err != nil {
		t.Fatal(err)
	}
	served := func(available bool) string {
		return fmt.Sprintf("capm3_os_image_server_images:\n  %s: {available: %v, image_key: m}\n", sum("u"), available)
	}
	var names []string
	for i := range n {
		ns := fmt.Sprintf("conflicts-%02d", i)
		names = append(names, ns)
		namespace(t, ns, map[string]string{label: ""})
		put(t, ns, "os-images-info", nil, string(info))
		put(t, ns, "values", map[string]string{fleet.ClusterValuesLabel: ""}, clusterValues)
		put(t, ns, "served", nil, served(false))
	}
	// Someone else keeps writing the status objects while the check
	// rewrites them: the check's writes meet conflicts.
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ctx.Err() == nil; i++ {
			for _, ns := range names {
				cms := suite.Kube(t).Client.CoreV1().ConfigMaps(ns)
				cm, err := cms.Get(ctx, osimage.StatusConfigMapName, metav1.GetOptions{})
				if err != nil {
					continue
				}
				if cm.Annotations == nil {
					cm.Annotations = map[string]string{}
				}
				cm.Annotations["touched"] = fmt.Sprint(i)
				_, _ = cms.Update(ctx, cm, metav1.UpdateOptions{})
			}
		}
	}()
	retried := func() int { return log.count(func(l *errorLog) []string { return l.infos }, "deciding again") }
	// Until enough writes met a conflict to prove something.
	for round := 0; round < 4 || (retried() < 5 && round < 60); round++ {
		for _, ns := range names {
			put(t, ns, "served", nil, served(round%2 == 0))
		}
		want := osimage.StateServed
		if round%2 == 1 {
			want = osimage.StateNotAvailable
		}
		for _, ns := range names {
			testenv.Eventually(t, ns+" reports the served set", 60*time.Second, func() (bool, string) {
				r := status(t, ns)
				return len(r.Images) == 1 && r.Images[0].State == want, fmt.Sprint(r.Images)
			})
		}
	}
	stop()
	wg.Wait()
	conflicts := []string{"the object has been modified", "already exists", "conflict"}
	if n := log.count(func(l *errorLog) []string { return l.errors }, conflicts...); n > 0 {
		log.mu.Lock()
		t.Errorf("%d retried conflicts logged at ERROR, e.g. %s", n, log.errors[0])
		log.mu.Unlock()
	}
	t.Logf("%d writes refused on a stale cache, retried and logged at V(1)", retried())
	if retried() == 0 {
		t.Error("no write met a conflict: the test proved nothing")
	}
}
