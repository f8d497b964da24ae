package server

import (
	"context"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/sylva-projects/osimages/internal/kube"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/serverio"
	"github.com/sylva-projects/osimages/internal/testenv"
)

// countGets counts the GETs of one named object that go through it.
type countGets struct {
	next http.RoundTripper
	path string
	n    atomic.Int64
}

func (c *countGets) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, c.path) {
		c.n.Add(1)
	}
	return c.next.RoundTrip(r)
}

// The watched ConfigMap is read from the informer's store: its changes
// (and deletion) still reach the server at once, yet neither an event nor
// a poll of the values files costs a GET on the apiserver.
func TestWatchedConfigMapIsReadFromTheInformer(t *testing.T) {
	k := suite.Kube(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	key := kube.ObjectKey{Namespace: "default", Name: osimage.InfoConfigMapName}
	src := newFakeSource()
	a, b := src.add("ubuntu-a", []byte("image a"), false), src.add("ubuntu-b", []byte("image b"), false)
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name},
	}
	cm.Data = map[string]string{osimage.ValuesKey: catalogDoc(t, a)}
	if _, err := k.Client.CoreV1().ConfigMaps(key.Namespace).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	counter := &countGets{path: "/configmaps/" + key.Name}
	cfg := rest.CopyConfig(k.Config)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { counter.next = rt; return counter })
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}

	dir := t.TempDir()
	vals := filepath.Join(dir, "values.yaml")
	writeInputs(t, filepath.Join(dir, "unused.yaml"), vals, "", "os_image_server_additional_selectors:\n  all: {os: ubuntu}\n")
	var mu sync.Mutex
	var seen []serverio.Loaded
	loaded := func() (int, serverio.Loaded) {
		mu.Lock()
		defer mu.Unlock()
		if len(seen) == 0 {
			return 0, serverio.Loaded{}
		}
		return len(seen), seen[len(seen)-1]
	}
	in := serverio.Inputs{OSImagesConfigMap: &key, Client: client, ValueFiles: []string{vals}, Poll: 20 * time.Millisecond}
	watchErr := make(chan error, 1)
	go func() {
		watchErr <- in.Watch(ctx, nil, func(l serverio.Loaded) error {
			mu.Lock()
			defer mu.Unlock()
			seen = append(seen, l)
			return nil
		})
	}()
	testenv.Eventually(t, "the first reading", time.Minute, func() (bool, string) {
		n, l := loaded()
		return n == 1 && len(l.Catalog) == 1, ""
	})

	// A change of the ConfigMap is seen through the informer.
	cm.Data[osimage.ValuesKey] = catalogDoc(t, a, b)
	if _, err := k.Client.CoreV1().ConfigMaps(key.Namespace).Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "the ConfigMap change", time.Minute, func() (bool, string) {
		_, l := loaded()
		return len(l.Catalog) == 2, ""
	})
	// A change of the values file is seen by a poll, which reads the
	// ConfigMap too: from the store.
	writeInputs(t, filepath.Join(dir, "unused.yaml"), vals, "", "os_image_server_additional_selectors:\n  all: {os: ubuntu, flavor: plain}\n")
	testenv.Eventually(t, "the values change", time.Minute, func() (bool, string) {
		_, l := loaded()
		return len(l.Catalog) == 2 && strings.Contains(toString(l.Values), "plain"), ""
	})
	if n := counter.n.Load(); n != 0 {
		t.Errorf("%d GETs of ConfigMap %s: the watched ConfigMap must be read from the informer's store", n, key)
	}
	cancel()
	if err := <-watchErr; err != nil {
		t.Errorf("Watch: %v", err)
	}
}

func toString(v map[string]any) string {
	var b strings.Builder
	for k, x := range v {
		b.WriteString(k)
		if m, ok := x.(map[string]any); ok {
			b.WriteString(toString(m))
		} else if s, ok := x.(string); ok {
			b.WriteString(s)
		}
	}
	return b.String()
}
