package server

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/sylva-projects/osimages/internal/serverio"
	"github.com/sylva-projects/osimages/internal/testenv"
)

// chromium finds Debian's headless browser, or ends the test through
// testenv.Missing (a failure in CI).
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if path, err := exec.LookPath(name); err == nil {
			return path
		}
	}
	testenv.Missing(t, "chromium is not installed (apt-get install chromium; hack/tools.sh installs it as root): the status page is not checked in a browser")
	return ""
}

// TestStatusPageInChromium loads the status page in a real headless browser
// and checks that every state an operator must see is rendered.
func TestStatusPageInChromium(t *testing.T) {
	browser := chromium(t)
	src := newFakeSource()
	failed := src.add("a-failed", []byte("a"), false)
	ready := src.add("b-ready", []byte("b bytes"), false)
	downloading := src.add("c-downloading", []byte("c bytes, held half way"), true)
	queued := src.add("d-queued", []byte("d"), false)
	src.fail[failed.SHA256] = errors.New("tag not found: the registry has no such repository or tag")
	h := start(t, t.TempDir(), src, func(c *Config) { c.Concurrency = 1; c.RetryBase = time.Hour; c.RetryMax = time.Hour })
	h.want(failed, ready, downloading, queued)
	h.waitPhase(failed.SHA256, PhaseFailed)
	h.waitPhase(ready.SHA256, PhaseReady)
	h.waitPhase(downloading.SHA256, PhaseDownloading)
	testenv.Poll(t, "the third download under way", 5*time.Second, 5*time.Millisecond, func() (bool, string) {
		st, _ := h.srv.Statuses()
		return len(st) > 2 && st[2].Received > 0, fmt.Sprintf("%+v", st)
	})

	h.srv.ReportInputs(&serverio.RefusedError{Reason: serverio.RefusalNearMiss, Err: errors.New("os_images.yaml: os_image: did you mean os_images?")})

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, browser, "--headless", "--no-sandbox", "--disable-gpu",
		"--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run",
		"--user-data-dir="+t.TempDir(), "--dump-dom", h.http.URL+"/").Output()
	if err != nil {
		t.Fatalf("chromium: %v", err)
	}
	dom := string(out)
	for _, want := range []string{
		`<title>osimages image server</title>`,
		`data-sha256="` + ready.SHA256.String() + `"`,
		`class="phase ready">ready</span>`,
		`class="phase downloading">downloading</span> 50%`,
		`class="phase failed">failed</span>`,
		`tag not found: the registry has no such repository or tag`,
		`class="phase queued">queued</span>`,
		`href="/images/` + ready.SHA256.String() + `/b-ready.raw"`,
		`1 ready`, `1 downloading`, `1 queued`, `1 failed`,
		`id="inputs-refused"`, `Inputs refused (near-miss)`, `os_image: did you mean os_images?`,
	} {
		if !strings.Contains(dom, want) {
			t.Errorf("the page as Chromium rendered it lacks %q", want)
		}
	}
	if t.Failed() {
		t.Logf("DOM:\n%s", dom)
	}
	src.release(downloading.SHA256)
}
