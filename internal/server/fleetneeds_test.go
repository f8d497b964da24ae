package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sylva-projects/osimages/internal/imagestore"
	"github.com/sylva-projects/osimages/internal/kube"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/servedset"
	"github.com/sylva-projects/osimages/internal/serverio"
	"github.com/sylva-projects/osimages/internal/testenv"
)

// The fleet's needs are a third input, watched through an informer: an
// absent ConfigMap is no need (not an error), a new version reaches
// apply at once. One that does not parse, or that osimages did not write
// (no label), is not a refusal of the inputs: the management inputs still
// apply, and the caller keeps the needs it had (NeedsError); a need with a
// malformed sha256 is dropped alone (issue 23, items 4 and 19).
func TestFleetNeedsAreAWatchedInput(t *testing.T) {
	k := suite.Kube(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ns := "fleet-needs-input"
	k.Namespace(t, ns, nil)
	dir := t.TempDir()
	osImages, vals := filepath.Join(dir, "os-images.yaml"), filepath.Join(dir, "values.yaml")
	for _, f := range []string{osImages, vals} {
		if err := os.WriteFile(f, []byte("os_images: {}\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	key := kube.ObjectKey{Namespace: ns, Name: osimage.FleetNeedsConfigMapName}
	var mu sync.Mutex
	var loaded []serverio.Loaded
	var refusals []error
	in := serverio.Inputs{OSImagesFile: osImages, ValueFiles: []string{vals}, FleetNeedsConfigMap: &key, Client: k.Client, Poll: time.Hour,
		Report: func(err error) {
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				refusals = append(refusals, err)
			}
		}}
	done := make(chan error, 1)
	go func() {
		done <- in.Watch(ctx, nil, func(l serverio.Loaded) error {
			mu.Lock()
			defer mu.Unlock()
			loaded = append(loaded, l)
			return nil
		})
	}()
	last := func() (serverio.Loaded, int, int) {
		mu.Lock()
		defer mu.Unlock()
		if len(loaded) == 0 {
			return serverio.Loaded{}, 0, len(refusals)
		}
		return loaded[len(loaded)-1], len(loaded), len(refusals)
	}
	testenv.Eventually(t, "inputs loaded without the ConfigMap", 10*time.Second, func() (bool, string) {
		l, n, _ := last()
		return n == 1 && l.Needs != nil && len(l.Needs.Images) == 0, ""
	})
	sha := strings.Repeat("a", 64)
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: key.Name, Labels: map[string]string{osimage.FleetNeedsLabel: ""}},
		Data: map[string]string{osimage.FleetNeedsKey: "images:\n- sha256: " + sha + "\n  namespaces: [wc1]\n"}}
	if _, err := k.Client.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "the need reaches apply", 10*time.Second, func() (bool, string) {
		l, n, _ := last()
		return n == 2 && l.Needs != nil && len(l.Needs.Images) == 1 && l.Needs.Images[0].SHA256.String() == sha, ""
	})
	update := func(labels map[string]string, doc string) {
		t.Helper()
		cm.Labels, cm.Data[osimage.FleetNeedsKey] = labels, doc
		var err error
		if cm, err = k.Client.CoreV1().ConfigMaps(ns).Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	ours := map[string]string{osimage.FleetNeedsLabel: ""}
	update(ours, "images:\n- sha256: "+strings.ToUpper(sha)+"\n  namespaces: [evil]\n- sha256: "+sha+"\n  namespaces: [wc1]\n")
	testenv.Eventually(t, "a malformed need is dropped alone", 10*time.Second, func() (bool, string) {
		l, n, _ := last()
		return n == 3 && l.Needs != nil && len(l.Needs.Images) == 1 && len(l.NeedsDropped) == 1 && l.NeedsError == nil, fmt.Sprintf("%+v", l)
	})
	update(ours, "images:\n- sha256: [not, a, string]\n")
	testenv.Eventually(t, "a broken document leaves the needs to the caller, and no refusal", 10*time.Second, func() (bool, string) {
		l, n, r := last()
		return n == 4 && r == 0 && l.Needs == nil && l.NeedsError != nil, fmt.Sprintf("%+v", l)
	})
	update(nil, "images:\n- sha256: "+sha+"\n  namespaces: [wc1]\n")
	testenv.Eventually(t, "a document without osimages' label is not used", 10*time.Second, func() (bool, string) {
		l, n, r := last()
		return n == 5 && r == 0 && l.Needs == nil && l.NeedsError != nil && strings.Contains(l.NeedsError.Error(), osimage.FleetNeedsLabel), fmt.Sprintf("%+v", l)
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// asNeed makes w a fleet need of namespaces, served from records.
func asNeed(w servedset.Wanted, records []servedset.Record, namespaces ...string) servedset.Wanted {
	w.Records = records
	w.Use(records[0])
	w.ForNamespaces = namespaces
	w.Filenames = nil
	for _, r := range records {
		w.Filenames = append(w.Filenames, r.Desc.Filename)
	}
	slices.Sort(w.Filenames)
	return w
}

// A record that names a tag that does not exist, given by one tenant
// first, does not block the image of the tenant whose record is right:
// the next record is tried at once. When every record fails, each
// namespace is told what its own record gave, and only that (issue 23,
// item 1).
func TestAFleetNeedTriesEveryRecord(t *testing.T) {
	src := newFakeSource()
	good := src.add("ubuntu", []byte(strings.Repeat("u", 64)), false)
	bad := good.Desc
	bad.URI, bad.Filename = "oci://example/ubuntu:does-not-exist", "evil.raw"
	src.failURI["oci://example/ubuntu:does-not-exist"] = errors.New("manifest unknown: tag does-not-exist")
	need := asNeed(good, []servedset.Record{
		{Key: "aaa", Desc: bad, Namespaces: []string{"evil"}},
		{Key: "ubuntu", Desc: good.Desc, Namespaces: []string{"victim"}},
	}, "evil", "victim")
	// A day of backoff: only trying the next record at once serves it.
	h := start(t, t.TempDir(), src, func(c *Config) { c.RetryBase, c.RetryMax = 24*time.Hour, 24*time.Hour })
	h.want(need)
	h.waitPhase(good.SHA256, PhaseReady)
	for _, name := range []string{"ubuntu.raw", "evil.raw"} {
		resp, body := h.get(osimage.ImagePath(good.SHA256, name))
		if resp.StatusCode != http.StatusOK || string(body) != strings.Repeat("u", 64) {
			t.Errorf("%s: HTTP %d", name, resp.StatusCode)
		}
	}
	if got := src.pulls.Load(); got != 2 {
		t.Errorf("%d pulls, want the bad record's then the good one's", got)
	}

	// Both records wrong: the image fails, and each namespace's status
	// gets its own record's reason.
	src2 := newFakeSource()
	img := src2.add("img", []byte(strings.Repeat("i", 64)), false)
	other := img.Desc
	other.URI = "oci://example/other:1"
	src2.failURI[img.Desc.URI] = errors.New("unauthorized: the victim's registry wants credentials")
	src2.failURI["oci://example/other:1"] = errors.New("manifest unknown: tag 1")
	need = asNeed(img, []servedset.Record{
		{Key: "aaa", Desc: other, Namespaces: []string{"evil"}},
		{Key: "img", Desc: img.Desc, Namespaces: []string{"victim"}},
	}, "evil", "victim")
	h2 := start(t, t.TempDir(), src2, func(c *Config) { c.RetryBase, c.RetryMax = 24*time.Hour, 24*time.Hour })
	h2.want(need)
	h2.waitPhase(img.SHA256, PhaseFailed)
	refused := h2.srv.RefusedNeeds()
	victim, ok := refused.For("victim", img.SHA256)
	if !ok || victim.Reason != osimage.RefusedDownload || !strings.Contains(victim.Message, "unauthorized") || strings.Contains(victim.Message, "manifest unknown") {
		t.Errorf("victim's refusal: %+v", victim)
	}
	evil, ok := refused.For("evil", img.SHA256)
	if !ok || !strings.Contains(evil.Message, "manifest unknown") || strings.Contains(evil.Message, "unauthorized") {
		t.Errorf("evil's refusal: %+v", evil)
	}
}

// The management selection is claimed before any need, whatever the keys,
// and a need never takes the room a management image needs: with room for
// one image only, the management one is served (issue 23, item 3).
func TestTheManagementSelectionComesBeforeTheFleetsNeeds(t *testing.T) {
	src := newFakeSource()
	mgmt := src.add("zzz-mgmt", []byte(strings.Repeat("m", 60)), false)
	tenant := src.add("aaa-tenant", []byte(strings.Repeat("t", 60)), false)
	for _, w := range []*servedset.Wanted{&mgmt, &tenant} {
		w.Desc.ArchiveSize = 1
	}
	need := asNeed(tenant, []servedset.Record{{Key: tenant.Key, Desc: tenant.Desc, Namespaces: []string{"wc1"}}}, "wc1")
	h := start(t, t.TempDir(), src, func(c *Config) { c.MaxStorage = 100; c.RetryBase, c.RetryMax = time.Hour, time.Hour })
	h.want(need, mgmt)
	h.waitPhase(mgmt.SHA256, PhaseReady)
	h.waitPhase(need.SHA256, PhaseFailed)
	statuses, _ := h.srv.Statuses()
	for _, st := range statuses {
		if st.SHA256 == need.SHA256 && !strings.Contains(st.Reason, "not enough storage") {
			t.Errorf("the need's reason: %q", st.Reason)
		}
	}
}

// A need that holds space while a management image waits for it gives way
// at once, its partial kept: the management image is never blocked by a
// need (issue 23, item 3).
func TestANeedGivesWayToAManagementImageWaitingForSpace(t *testing.T) {
	src := newFakeSource()
	tenant := src.add("tenant", []byte(strings.Repeat("t", 60)), true)
	mgmt := src.add("mgmt", []byte(strings.Repeat("m", 60)), false)
	for _, w := range []*servedset.Wanted{&mgmt, &tenant} {
		w.Desc.ArchiveSize = 1
	}
	need := asNeed(tenant, []servedset.Record{{Key: tenant.Key, Desc: tenant.Desc, Namespaces: []string{"wc1"}}}, "wc1")
	h := start(t, t.TempDir(), src, func(c *Config) { c.MaxStorage = 100; c.RetryBase, c.RetryMax = time.Hour, time.Hour })
	h.want(need)
	h.waitPhase(need.SHA256, PhaseDownloading)
	// The tenant's download holds its room, and never ends by itself.
	h.want(need, mgmt)
	h.waitPhase(mgmt.SHA256, PhaseReady)
	statuses, _ := h.srv.Statuses()
	for _, st := range statuses {
		if st.SHA256 == need.SHA256 && st.Phase == PhaseReady {
			t.Error("the need is stored: there is room for one image only")
		}
	}
}

// The refusals of the fleet's needs never keep the served set from its
// ConfigMap: past 256 KiB the first of each namespace is kept first, and
// none is published when the served set leaves no room (issue 23, item 2).
func TestRefusalsNeverKeepTheServedSetFromItsConfigMap(t *testing.T) {
	store, err := imagestore.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	s := New(Config{Store: store})
	var refused osimage.RefusedNeeds
	for i := range 3000 {
		refused = append(refused, osimage.RefusedNeed{SHA256: osimage.SHA256(fmt.Sprintf("%064x", i)), Namespace: fmt.Sprintf("wc-%02d", i%40),
			Reason: osimage.RefusedImages, Message: strings.Repeat("m", 100)})
	}
	s.SetRefusedNeeds(refused)
	got := s.RefusedNeeds()
	if len(got) >= len(refused) || len(got) == 0 {
		t.Fatalf("%d of %d refusals kept", len(got), len(refused))
	}
	doc, _ := osimage.MarshalRefusedNeeds(got)
	if len(doc) > maxRefusedBytes+64<<10 {
		t.Errorf("the refusals take %d bytes", len(doc))
	}
	for i := range 40 {
		if _, ok := got.For(fmt.Sprintf("wc-%02d", i), osimage.SHA256(fmt.Sprintf("%064x", i))); !ok {
			t.Errorf("the first refusal of wc-%02d is left out", i)
		}
	}

	// A served set that leaves no room: published without them.
	wanted := map[osimage.SHA256]servedset.Wanted{}
	for i := range 2200 {
		sha := osimage.SHA256(fmt.Sprintf("%064x", 10000+i))
		name := fmt.Sprintf("%05d-%s.raw", i, strings.Repeat("x", 240))
		wanted[sha] = servedset.Wanted{SHA256: sha, Key: "k", Filenames: []string{name}, Desc: osimage.Descriptor{Filename: name}}
	}
	s.SetDesired(wanted, nil)
	s.mu.Lock()
	out := s.outputLocked()
	s.mu.Unlock()
	if _, err := out.ConfigMapData("the served set"); err != nil {
		t.Fatalf("the output cannot be published: %v", err)
	}
	if len(out.Refused) != 0 || len(out.Set) != 2200 {
		t.Errorf("%d refusals and %d images published", len(out.Refused), len(out.Set))
	}
}
