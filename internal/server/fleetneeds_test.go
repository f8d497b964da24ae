package server

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sylva-projects/osimages/internal/fleet"
	"github.com/sylva-projects/osimages/internal/kube"
	"github.com/sylva-projects/osimages/internal/testenv"
)

// The fleet's needs are a third input, watched through an informer: an
// absent ConfigMap is no need (not an error), a new version reaches
// apply at once, and one that does not parse is refused like any input,
// the last good ones staying in force.
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
	key := kube.ObjectKey{Namespace: ns, Name: fleet.FleetNeedsConfigMapName}
	var mu sync.Mutex
	var loaded []Loaded
	var refusals []error
	in := Inputs{OSImagesFile: osImages, ValueFiles: []string{vals}, FleetNeedsConfigMap: &key, Client: k.Client, Poll: time.Hour,
		Report: func(err error) {
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				refusals = append(refusals, err)
			}
		}}
	done := make(chan error, 1)
	go func() {
		done <- in.Watch(ctx, nil, func(l Loaded) error {
			mu.Lock()
			defer mu.Unlock()
			loaded = append(loaded, l)
			return nil
		})
	}()
	last := func() (Loaded, int, int) {
		mu.Lock()
		defer mu.Unlock()
		if len(loaded) == 0 {
			return Loaded{}, 0, len(refusals)
		}
		return loaded[len(loaded)-1], len(loaded), len(refusals)
	}
	testenv.Eventually(t, "inputs loaded without the ConfigMap", 10*time.Second, func() (bool, string) {
		l, n, _ := last()
		return n == 1 && l.Needs != nil && len(l.Needs.Images) == 0, ""
	})
	sha := strings.Repeat("a", 64)
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: key.Name},
		Data: map[string]string{fleet.FleetNeedsKey: "images:\n- sha256: " + sha + "\n  namespaces: [wc1]\n"}}
	if _, err := k.Client.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "the need reaches apply", 10*time.Second, func() (bool, string) {
		l, n, _ := last()
		return n == 2 && len(l.Needs.Images) == 1 && l.Needs.Images[0].SHA256 == sha, ""
	})
	cm.Data[fleet.FleetNeedsKey] = "images:\n- sha256: nope\n"
	if _, err := k.Client.CoreV1().ConfigMaps(ns).Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "a broken document is refused", 10*time.Second, func() (bool, string) {
		_, n, r := last()
		return n == 2 && r == 1, ""
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
