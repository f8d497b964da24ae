package server

import (
	"html"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sylva-projects/osimages/internal/imagehttp"
	"github.com/sylva-projects/osimages/internal/servedset"
)

// TestWaitingForCatalogIsAPhase: before any catalog, the server is up and
// says so: /readyz answers 200, the status page and the metric name the
// phase and why, nothing is published, and stored images are neither served
// nor collected, however long the catalog takes.
func TestWaitingForCatalogIsAPhase(t *testing.T) {
	src := newFakeSource()
	a := src.add("ubuntu-a", []byte("a bytes"), false)
	dir := t.TempDir()
	h := start(t, dir, src, nil)
	h.want(a)
	h.waitPhase(a.SHA256, PhaseReady)
	h.stop()

	h = start(t, dir, src, nil)
	if _, body := h.get("/metrics"); !strings.Contains(string(body), `osimages_server_phase{phase="starting"} 1`) {
		t.Errorf("metrics before the inputs are read:\n%s", grepLines(string(body), "osimages_server_phase"))
	}
	why := "no catalog yet: ConfigMap sylva-system/os-images-info has no values.yaml yet"
	h.srv.WaitForCatalog(errorString(why))
	if resp, _ := h.get("/readyz"); resp.StatusCode != http.StatusOK {
		t.Errorf("/readyz while waiting for the catalog: %d, want 200", resp.StatusCode)
	}
	_, page := h.get("/")
	if !strings.Contains(string(page), "Waiting for the catalog") || !strings.Contains(string(page), "CatalogLoaded=False (WaitingForCatalog): "+why) {
		t.Errorf("status page while waiting:\n%s", page)
	}
	_, metrics := h.get("/metrics")
	for _, want := range []string{`osimages_server_phase{phase="waiting-for-catalog"} 1`, `osimages_server_phase{phase="serving"} 0`, `osimages_server_phase{phase="starting"} 0`} {
		if !strings.Contains(string(metrics), want) {
			t.Errorf("metrics lack %s:\n%s", want, grepLines(string(metrics), "osimages_server_phase"))
		}
	}
	// Far past the grace period, the stored image is still there.
	h.clock.advance(48 * time.Hour)
	h.srv.CollectGarbage()
	if _, ok := h.store.Get(a.SHA256); !ok {
		t.Fatal("a stored image was collected while the server waited for its catalog")
	}
	if _, err := os.Stat(h.output); !os.IsNotExist(err) {
		t.Errorf("something was published before any catalog: %v", err)
	}

	h.want(a)
	h.waitPublished(a.SHA256, true)
	if got := h.srv.Condition(); got.Status != "True" || h.srv.Phase() != imagehttp.ServerServing {
		t.Errorf("after the catalog: %s %+v", h.srv.Phase(), got)
	}
	// A later fault of the inputs does not turn the server back.
	h.srv.WaitForCatalog(errorString(why))
	if h.srv.Phase() != imagehttp.ServerServing {
		t.Errorf("phase %s after a later catalog fault, want serving (the last good inputs stay)", h.srv.Phase())
	}
}

type errorString string

func (e errorString) Error() string { return string(e) }

// TestStatusPageLinksEscapeFilenames: a filename with #, ? or % stays one
// path segment in the status page's link, and the link leads to the image.
func TestStatusPageLinksEscapeFilenames(t *testing.T) {
	src := newFakeSource()
	var ws []servedset.Wanted
	for i, name := range []string{"a#1.raw", "b?x=1.raw", "c%41.raw", "d e+(1).raw"} {
		w := src.add("img"+strconv.Itoa(i), []byte("bytes of "+name), false)
		w.Desc.Filename = name
		ws = append(ws, w)
	}
	h := start(t, t.TempDir(), src, nil)
	h.want(ws...)
	for _, w := range ws {
		h.waitPhase(w.SHA256, PhaseReady)
	}
	_, page := h.get("/")
	hrefs := regexp.MustCompile(`href="(/images/[^"]*)"`).FindAllStringSubmatch(string(page), -1)
	if len(hrefs) != len(ws) {
		t.Fatalf("%d image links on the status page, want %d:\n%s", len(hrefs), len(ws), page)
	}
	for _, m := range hrefs {
		href := html.UnescapeString(m[1])
		resp, body := h.get(href)
		if resp.StatusCode != 200 || !strings.HasPrefix(string(body), "bytes of ") {
			t.Errorf("link %s: %d %q", href, resp.StatusCode, body)
		}
	}
}
