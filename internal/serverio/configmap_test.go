package serverio

import (
	"context"
	"errors"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/sylva-projects/osimages/internal/kube"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/testenv"
)

// suite is the apiserver of the package's ConfigMap tests; each test
// works in a namespace of its own, named by the apiserver, so that runs
// of a test (go test -count=N) never meet.
var suite = testenv.NewSuite(nil)

func TestMain(m *testing.M) { os.Exit(suite.Run(m)) }

// namespace creates a namespace for the test and returns its client and
// name.
func namespace(t *testing.T) (kubernetes.Interface, string) {
	t.Helper()
	k := suite.Kube(t)
	ns, err := k.Client.CoreV1().Namespaces().Create(context.Background(),
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "serverio-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return k.Client, ns.Name
}

func TestConfigMapPublisherRoundTrip(t *testing.T) {
	c, ns := namespace(t)
	ctx := context.Background()
	p := ConfigMapPublisher{Client: c, Key: kube.ObjectKey{Namespace: ns, Name: "served-images"}}

	if got, err := p.Published(ctx); err != nil || got == nil || len(got) != 0 {
		t.Fatalf("no ConfigMap: %v, %v; want an empty set", got, err)
	}
	out := output()
	out.Refused = osimage.RefusedNeeds{{Namespace: "tenant", SHA256: sha('c'), Reason: "over its share"}}
	if err := p.Publish(ctx, out); err != nil {
		t.Fatal(err)
	}
	cm, err := c.CoreV1().ConfigMaps(ns).Get(ctx, "served-images", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	files, err := osimage.ParseServedFilenames([]byte(cm.Data[osimage.ServedFilenamesKey]))
	if err != nil || len(files[sha('a')]) != 1 || files[sha('a')][0] != "ubuntu.img" {
		t.Errorf("served filenames %v (%v) from %q", files, err, cm.Data[osimage.ServedFilenamesKey])
	}
	if !strings.Contains(cm.Data[osimage.RefusedNeedsKey], "tenant") {
		t.Errorf("refused needs not published: %v", cm.Data)
	}
	got, err := p.Published(ctx)
	if err != nil || len(got) != 2 || got[sha('a')] != out.Set[sha('a')] || got[sha('b')] != out.Set[sha('b')] {
		t.Fatalf("read back %v, %v; want %v", got, err, out.Set)
	}

	// A second publication replaces the data, the refusals included.
	if err := p.Publish(ctx, osimage.ServedOutput{Set: osimage.ServedSet{sha('d'): {ImageKey: "d"}}}); err != nil {
		t.Fatal(err)
	}
	cm, err = c.CoreV1().ConfigMaps(ns).Get(ctx, "served-images", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := cm.Data[osimage.RefusedNeedsKey]; ok {
		t.Errorf("refusals that are over are still published: %v", cm.Data)
	}
	if got, err := p.Published(ctx); err != nil || len(got) != 1 || got[sha('d')].ImageKey != "d" {
		t.Errorf("after the second publication: %v, %v", got, err)
	}
}

// The chart creates the ConfigMap empty; a ConfigMap someone broke is an
// error naming it.
func TestConfigMapPublisherPublishedOfOthersConfigMaps(t *testing.T) {
	c, ns := namespace(t)
	ctx := context.Background()
	for name, data := range map[string]map[string]string{
		"empty":      nil,
		"blank":      {osimage.ValuesKey: ""},
		"broken":     {osimage.ValuesKey: "capm3_os_image_server_images: [\n"},
		"look-alike": {osimage.ValuesKey: "capm3_os_image_server_images:\n  " + string(sha('a')) + ": {available: true, image_key: a, extra: 1}\n"},
	} {
		if _, err := c.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: data}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"empty", "blank"} {
		got, err := ConfigMapPublisher{Client: c, Key: kube.ObjectKey{Namespace: ns, Name: name}}.Published(ctx)
		if err != nil || got == nil || len(got) != 0 {
			t.Errorf("%s: %v, %v; want an empty set", name, got, err)
		}
	}
	for _, name := range []string{"broken", "look-alike"} {
		key := kube.ObjectKey{Namespace: ns, Name: name}
		_, err := ConfigMapPublisher{Client: c, Key: key}.Published(ctx)
		if err == nil || !strings.Contains(err.Error(), "ConfigMap "+key.String()) {
			t.Errorf("%s: %v, want an error naming ConfigMap %s", name, err, key)
		}
	}
}

// A set that a ConfigMap cannot hold is refused before the apiserver is
// asked, naming the ConfigMap, and the last publication stays.
func TestConfigMapPublisherRefusesATooLargeSet(t *testing.T) {
	c, ns := namespace(t)
	ctx := context.Background()
	p := ConfigMapPublisher{Client: c, Key: kube.ObjectKey{Namespace: ns, Name: "served-images"}}
	if err := p.Publish(ctx, output()); err != nil {
		t.Fatal(err)
	}
	big := osimage.ServedOutput{Set: osimage.ServedSet{}, Filenames: osimage.ServedFilenames{}}
	for i := range 8000 {
		s := osimage.SHA256(strings.Repeat("0", 58) + itox(i))
		big.Set[s] = osimage.ServedImage{Available: true, ImageKey: strings.Repeat("k", 60)}
		big.Filenames[s] = []string{strings.Repeat("f", 60) + ".img"}
	}
	err := p.Publish(ctx, big)
	if err == nil || !strings.Contains(err.Error(), "ConfigMap "+p.Key.String()) {
		t.Fatalf("publishing %d images: %v, want a refusal naming the ConfigMap", len(big.Set), err)
	}
	if got, err := p.Published(ctx); err != nil || len(got) != 2 {
		t.Errorf("after a refused publication: %v, %v; want the last one", got, err)
	}
}

// itox is i in hex, six digits.
func itox(i int) string {
	const digits = "0123456789abcdef"
	b := []byte("000000")
	for j := 5; j >= 0; j-- {
		b[j] = digits[i%16]
		i /= 16
	}
	return string(b)
}

// TestConfigMapPublisherWatchOutput: the watcher is told of the
// ConfigMap's data when it appears, of an edit by hand, and of its
// deletion.
func TestConfigMapPublisherWatchOutput(t *testing.T) {
	c, ns := namespace(t)
	ctx, cancel := context.WithCancel(context.Background())
	p := ConfigMapPublisher{Client: c, Key: kube.ObjectKey{Namespace: ns, Name: "served-images"}}

	type seen struct {
		values string
		exists bool
	}
	var mu sync.Mutex
	var events []seen
	done := make(chan error, 1)
	go func() {
		done <- p.WatchOutput(ctx, func(data map[string]string, exists bool) {
			mu.Lock()
			defer mu.Unlock()
			events = append(events, seen{data[osimage.ValuesKey], exists})
		})
	}()
	defer func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("WatchOutput: %v", err)
			}
		case <-time.After(time.Minute):
			t.Error("WatchOutput did not return after its context ended")
		}
	}()
	waitFor := func(what string, ok func(seen) bool) {
		t.Helper()
		testenv.Eventually(t, what, time.Minute, func() (bool, string) {
			mu.Lock()
			defer mu.Unlock()
			for _, e := range events {
				if ok(e) {
					return true, ""
				}
			}
			return false, ""
		})
	}

	if err := p.Publish(ctx, output()); err != nil {
		t.Fatal(err)
	}
	waitFor("the publication", func(e seen) bool { return e.exists && strings.Contains(e.values, string(sha('a'))) })

	cm, err := c.CoreV1().ConfigMaps(ns).Get(ctx, "served-images", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cm.Data[osimage.ValuesKey] = "edited by hand"
	if _, err := c.CoreV1().ConfigMaps(ns).Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor("the edit", func(e seen) bool { return e.exists && e.values == "edited by hand" })

	if err := c.CoreV1().ConfigMaps(ns).Delete(ctx, "served-images", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor("the deletion", func(e seen) bool { return !e.exists })
}

// The watched inputs: the os_images ConfigMap that the catalog writes, and
// the fleet's needs.
func TestLoadFromConfigMaps(t *testing.T) {
	c, ns := namespace(t)
	ctx := context.Background()
	dir := t.TempDir()
	in := Inputs{
		OSImagesConfigMap:   &kube.ObjectKey{Namespace: ns, Name: "os-images-info"},
		FleetNeedsConfigMap: &kube.ObjectKey{Namespace: ns, Name: "fleet-needs"},
		Client:              c,
		ValueFiles:          []string{dir + "/values.yaml"},
	}
	write(t, in.ValueFiles[0], valuesDoc)

	_, _, err := in.Load(ctx)
	if err == nil || !strings.Contains(err.Error(), "ConfigMap "+ns+"/os-images-info does not exist yet") {
		t.Fatalf("no ConfigMap yet: %v", err)
	}
	if !isNoCatalogYet(err) {
		t.Errorf("a missing catalog is not ErrNoCatalogYet: %v", err)
	}
	cms := c.CoreV1().ConfigMaps(ns)
	info := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "os-images-info"}}
	if info, err = cms.Create(ctx, info, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := in.Load(ctx); !isNoCatalogYet(err) || !strings.Contains(err.Error(), "has no values.yaml yet") {
		t.Fatalf("an empty ConfigMap: %v", err)
	}
	info.Data = map[string]string{osimage.ValuesKey: osImagesDoc}
	if _, err := cms.Update(ctx, info, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	l, _, err := in.Load(ctx)
	if err != nil || len(l.Catalog) != 1 {
		t.Fatalf("catalog %v, %v", l.Catalog, err)
	}
	if l.Needs == nil || len(l.Needs.Images) != 0 || l.NeedsError != nil {
		t.Errorf("no needs ConfigMap yet: %+v %v, want no need and no error", l.Needs, l.NeedsError)
	}

	// Needs the controller did not write are not served, and the
	// management inputs load all the same.
	needs := "images:\n- sha256: " + string(sha('e')) + "\n  namespaces: [tenant]\n- sha256: not-a-sha\n  namespaces: [tenant]\n"
	foreign := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "fleet-needs"}, Data: map[string]string{osimage.FleetNeedsKey: needs}}
	if foreign, err = cms.Create(ctx, foreign, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	l, _, err = in.Load(ctx)
	if err != nil || len(l.Catalog) != 1 {
		t.Fatalf("with a foreign needs ConfigMap: %v, %v", l.Catalog, err)
	}
	if l.Needs != nil || l.NeedsError == nil || !strings.Contains(l.NeedsError.Error(), osimage.FleetNeedsLabel) {
		t.Errorf("a needs ConfigMap without the label: needs %+v, error %v", l.Needs, l.NeedsError)
	}

	// Labelled, it is read; the malformed entry is dropped alone, named.
	foreign.Labels = map[string]string{osimage.FleetNeedsLabel: ""}
	if foreign, err = cms.Update(ctx, foreign, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	l, _, err = in.Load(ctx)
	if err != nil || l.NeedsError != nil {
		t.Fatalf("%v %v", err, l.NeedsError)
	}
	if l.Needs == nil || len(l.Needs.Images) != 1 || l.Needs.Images[0].SHA256 != sha('e') {
		t.Errorf("needs %+v", l.Needs)
	}
	if len(l.NeedsDropped) != 1 || !strings.Contains(l.NeedsDropped[0].Error(), "ConfigMap "+ns+"/fleet-needs") || !strings.Contains(l.NeedsDropped[0].Error(), "not-a-sha") {
		t.Errorf("dropped %v, want the malformed entry, naming the ConfigMap", l.NeedsDropped)
	}

	// A document that does not parse is an error of the needs alone.
	foreign.Data = map[string]string{osimage.FleetNeedsKey: "images: {\n"}
	if _, err := cms.Update(ctx, foreign, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	l, _, err = in.Load(ctx)
	if err != nil || len(l.Catalog) != 1 || l.NeedsError == nil || !strings.Contains(l.NeedsError.Error(), "ConfigMap "+ns+"/fleet-needs") {
		t.Errorf("unparsable needs: load error %v, needs error %v", err, l.NeedsError)
	}
}

func isNoCatalogYet(err error) bool { return errors.Is(err, ErrNoCatalogYet) }
