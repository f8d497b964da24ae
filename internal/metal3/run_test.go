package metal3

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"

	"github.com/sylva-projects/osimages/internal/testenv"
)

// syncBuffer is a log destination the test reads while Run writes.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// While discovery fails, the tracker cannot tell whether a Metal3 object
// may reference an image: it stays unsynced, so that nothing is
// collected, and says why. Once discovery answers without the Metal3
// group, it is synced and empty; Run ends with its context.
func TestReferencesUnsyncedWhileDiscoveryFails(t *testing.T) {
	var failing atomic.Bool
	failing.Store(true)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if failing.Load() {
			http.Error(w, "etcd is down", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/api":
			_, _ = w.Write([]byte(`{"kind":"APIVersions","versions":["v1"]}`))
		case "/apis":
			_, _ = w.Write([]byte(`{"kind":"APIGroupList","apiVersion":"v1","groups":[{"name":"apps",` +
				`"versions":[{"groupVersion":"apps/v1","version":"v1"}],"preferredVersion":{"groupVersion":"apps/v1","version":"v1"}}]}`))
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	disco, err := discovery.NewDiscoveryClientForConfig(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	var logs syncBuffer
	refs := NewReferences(nil, disco, slog.New(slog.NewTextHandler(&logs, nil)))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); refs.Run(ctx, 10*time.Millisecond) }()
	defer func() { cancel(); <-done }()

	testenv.Eventually(t, "the failure logged", 30*time.Second, func() (bool, string) {
		return strings.Contains(logs.String(), "no image is garbage-collected until it can"), logs.String()
	})
	if refs.Synced() {
		t.Fatal("synced while discovery fails")
	}
	failing.Store(false)
	testenv.Eventually(t, "synced without the Metal3 API", 30*time.Second, func() (bool, string) { return refs.Synced(), logs.String() })
	if !strings.Contains(logs.String(), "the Metal3 API ("+Group+") is not served") {
		t.Errorf("logs: %s", logs.String())
	}
	cancel()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not end with its context")
	}
}
