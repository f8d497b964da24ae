package server

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sylva-projects/osimages/internal/scrub"
	"github.com/sylva-projects/osimages/internal/testenv"
)

// metricValue reads one unlabelled sample from /metrics, over HTTP.
func (h *harness) metricValue(name string) string {
	h.t.Helper()
	_, body := h.get("/metrics")
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			return v
		}
	}
	return ""
}

func randomContent(n int, seed uint64) []byte {
	rng := rand.New(rand.NewPCG(seed, seed))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

// TestScrubReplacesAFlippedByte: one byte flipped on disk (same size, same
// inode: Open's checks cannot see it) is served as it is until the scrub
// runs; the scrub catches it, the image is out of service at once (not
// served, published unavailable), reported, downloaded again, and served
// again once verified.
func TestScrubReplacesAFlippedByte(t *testing.T) {
	src := newFakeSource()
	content := randomContent(3<<20, 1)
	a := src.add("scrubbed", content, false)
	dir := t.TempDir()
	logs := &logLines{}
	h := start(t, dir, src, func(c *Config) {
		c.ScrubInterval = time.Second
		c.ScrubRate = 1 << 30
		c.Logger = logs.logger()
	})
	h.want(a)
	h.waitPhase(a.SHA256, PhaseReady)
	h.waitPublished(a.SHA256, true)
	// The next download waits at half, so that the state between the scrub
	// and the new copy can be seen.
	src.mu.Lock()
	src.gates[a.SHA256] = make(chan struct{})
	src.mu.Unlock()

	path := filepath.Join(dir, "images", a.SHA256.String(), a.Desc.Filename)
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte{content[1234] ^ 0x01}, 1234); err != nil {
		t.Fatal(err)
	}
	f.Close()
	// Before the scrub is due, the bad bytes are what the server has.
	if resp, body := h.get(imageURL(a)); resp.StatusCode != http.StatusOK || bytes.Equal(body, content) {
		t.Fatalf("before the scrub: %d, same content %v; want the flipped byte served (what the scrub is for)", resp.StatusCode, bytes.Equal(body, content))
	}

	h.clock.advance(2 * time.Second) // the scrub is due
	testenv.Eventually(t, "the scrub to report the image", 20*time.Second, func() (bool, string) {
		st := h.srv.ScrubStatus()
		return len(st.Failures) == 1, fmt.Sprintf("%+v", st)
	})
	if got := h.srv.ScrubStatus().Failures[0]; got.SHA256 != a.SHA256 || got.Key != "scrubbed" || !strings.Contains(got.Reason, "hashes to sha256") {
		t.Errorf("failure recorded: %+v", got)
	}
	resp, body := h.get(imageURL(a))
	if resp.StatusCode == http.StatusOK || bytes.Contains(body, content[:4096]) {
		t.Fatalf("after the scrub found it: %d; want it out of service", resp.StatusCode)
	}
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Errorf("after the scrub found it: %d, Retry-After %q; want 503 with Retry-After while it is downloaded again", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if resp, _ := h.get(imageURL(a) + ".sha256sum"); resp.StatusCode == http.StatusOK {
		t.Errorf("its checksum file is still served (%d)", resp.StatusCode)
	}
	h.waitPublished(a.SHA256, false)
	if v := h.metricValue("osimages_scrub_failures_total"); v != "1" {
		t.Errorf("osimages_scrub_failures_total %q, want 1", v)
	}
	if _, body := h.get("/"); !strings.Contains(string(body), `id="scrub-failures"`) || !strings.Contains(string(body), a.SHA256.String()) {
		t.Errorf("the status page does not report the failure:\n%s", body)
	}
	if logs.count("scrub failed", a.SHA256.String()) != 1 {
		t.Errorf("no warning of the scrub failure:\n%s", logs)
	}
	if _, err := os.Stat(path); err == nil {
		t.Error("the bad file is still in the store")
	}

	src.release(a.SHA256)
	h.waitPhase(a.SHA256, PhaseReady)
	h.waitPublished(a.SHA256, true)
	if resp, body := h.get(imageURL(a)); resp.StatusCode != http.StatusOK || !bytes.Equal(body, content) {
		t.Fatalf("after the new download: %d, right content %v", resp.StatusCode, bytes.Equal(body, content))
	}
	if n := src.pulls.Load(); n != 2 {
		t.Errorf("%d pulls, want 2", n)
	}
}

// TestDueScrubRunsAfterRestart: when each image was last checked is kept
// in the store, so that a restart scrubs at once an image whose scrub fell
// due while the server was down, and leaves alone one that is not due.
func TestDueScrubRunsAfterRestart(t *testing.T) {
	const day = 24 * time.Hour
	src := newFakeSource()
	old, recent := src.add("old", randomContent(1<<20, 2), false), src.add("recent", randomContent(2<<20, 3), false)
	dir := t.TempDir()
	h := start(t, dir, src, nil) // no scrub
	h.want(old)
	h.waitPhase(old.SHA256, PhaseReady)
	h.clock.advance(6 * day)
	h.want(old, recent)
	h.waitPhase(recent.SHA256, PhaseReady)
	t0 := h.clock.Now().Add(-6 * day)
	h.stop()

	// Down for two days: old was verified 8 days ago, recent 2 days ago.
	// The server starts eight days later: a clock advanced after the start
	// would race the scrub loop's first look.
	eightDaysLater := func(c *Config) {
		now := c.Now
		c.Now = func() time.Time { return now().Add(8 * day) }
		c.ScrubInterval = 7 * day
		c.ScrubRate = 1 << 30
	}
	h2 := start(t, dir, src, eightDaysLater)
	var st scrub.Status
	testenv.Eventually(t, "the due scrub to run and the scrub to be up to date", 20*time.Second, func() (bool, string) {
		st = h2.srv.ScrubStatus()
		return !st.UpToDate.IsZero() && h2.status(old.SHA256).CheckedAt.After(t0), fmt.Sprintf("%+v; old checked at %s", st, h2.status(old.SHA256).CheckedAt)
	})
	if st.Bytes != 1<<20 {
		t.Errorf("the scrub read %d bytes, want the %d of the due image only", st.Bytes, 1<<20)
	}
	if got := h2.status(recent.SHA256).CheckedAt; !got.Equal(t0.Add(6 * day)) {
		t.Errorf("recent, not due, was checked at %s, want its download at %s", got, t0.Add(6*day))
	}
	wantScrubbed := h2.status(old.SHA256).CheckedAt
	if !wantScrubbed.Equal(t0.Add(8 * day)) {
		t.Errorf("old was scrubbed at %s by the server's clock, want %s", wantScrubbed, t0.Add(8*day))
	}
	h2.stop()

	// The scrub is recorded: the next restart does not do it again.
	h3 := start(t, dir, src, eightDaysLater)
	testenv.Eventually(t, "the scrub to be up to date", 20*time.Second, func() (bool, string) {
		st = h3.srv.ScrubStatus()
		return !st.UpToDate.IsZero(), fmt.Sprintf("%+v", st)
	})
	if st.Bytes != 0 || !h3.status(old.SHA256).CheckedAt.Equal(wantScrubbed) {
		t.Errorf("after a second restart the scrub read %d bytes, old checked at %s; want nothing read, %s", st.Bytes, h3.status(old.SHA256).CheckedAt, wantScrubbed)
	}
}

// TestScrubRateIsBounded: the scrub never reads ahead of --scrub-rate by
// more than one chunk, and the image stays served while it is scrubbed.
func TestScrubRateIsBounded(t *testing.T) {
	const rate = 4 << 20
	const size = 12 << 20
	src := newFakeSource()
	content := randomContent(size, 4)
	a := src.add("paced", content, false)
	h := start(t, t.TempDir(), src, func(c *Config) {
		c.ScrubInterval = time.Second
		c.ScrubRate = rate
	})
	h.want(a)
	h.waitPhase(a.SHA256, PhaseReady)
	t0 := time.Now()
	h.clock.advance(2 * time.Second)
	served := false
	var peakExcess int64
	testenv.Poll(t, "the scrub to finish", 60*time.Second, 10*time.Millisecond, func() (bool, string) {
		st := h.srv.ScrubStatus()
		// Measured after reading the counter: the bound is generous.
		allowed := int64(1<<20) + int64(float64(rate)*time.Since(t0).Seconds())
		peakExcess = max(peakExcess, st.Bytes-allowed)
		// Served while scrubbed: the scrub of this image was under way
		// before the download and still after it (on a busy machine the
		// download may outlast the scrub: then try again, while it lasts).
		if st.Current == a.SHA256 && !served && st.Bytes < size {
			resp, body := h.get(imageURL(a))
			if resp.StatusCode != http.StatusOK || !bytes.Equal(body, content) {
				t.Errorf("during the scrub: %d, right content %v", resp.StatusCode, bytes.Equal(body, content))
			}
			after := h.srv.ScrubStatus()
			served = after.Current == a.SHA256 && after.Bytes < size
		}
		return st.Bytes == size && st.Current == "", fmt.Sprintf("%+v", st)
	})
	took := time.Since(t0)
	if peakExcess > 0 {
		t.Errorf("the scrub read %d bytes more than 1 MiB + %d B/s allows", peakExcess, rate)
	}
	if min := time.Duration(float64(size-1<<20) / rate * 0.9 * float64(time.Second)); took < min {
		t.Errorf("%d bytes scrubbed in %s at %d B/s; at least %s expected", size, took, rate, min)
	}
	if !served {
		t.Error("no download was served while the image was scrubbed")
	}
	t.Logf("%d MiB scrubbed in %s at a bound of %d MiB/s", size>>20, took.Round(time.Millisecond), rate>>20)
}

// TestScrubDatesInTheFutureAreDueNow: a verifiedAt or scrubbedAt after now
// (a clock set back, metadata restored or edited) is due now, and logged:
// the image is scrubbed at once, its scrub recorded at the present time,
// so that the next one is an interval away. On today's main such a date
// switched the scrub off for that image (a year ahead: a year and the
// interval without a scrub).
func TestScrubDatesInTheFutureAreDueNow(t *testing.T) {
	const day = 24 * time.Hour
	for _, field := range []string{"verifiedAt", "scrubbedAt"} {
		t.Run(field, func(t *testing.T) {
			src := newFakeSource()
			a := src.add("future", randomContent(1<<20, 6), false)
			dir := t.TempDir()
			h := start(t, dir, src, nil) // no scrub
			h.want(a)
			h.waitPhase(a.SHA256, PhaseReady)
			future := h.clock.Now().Add(365 * day)
			h.stop()
			meta := filepath.Join(dir, "images", a.SHA256.String(), ".osimages.json")
			var m map[string]any
			data, err := os.ReadFile(meta)
			if err == nil {
				err = json.Unmarshal(data, &m)
			}
			if err != nil {
				t.Fatal(err)
			}
			m[field] = future.Format(time.RFC3339Nano)
			if data, err = json.Marshal(m); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(meta, data, 0o644); err != nil {
				t.Fatal(err)
			}

			logs := &logLines{}
			h2 := start(t, dir, src, func(c *Config) {
				c.ScrubInterval = 7 * day
				c.ScrubRate = 1 << 30
				c.Logger = logs.logger()
			})
			var st scrub.Status
			testenv.Eventually(t, "the scrub to be up to date", 20*time.Second, func() (bool, string) {
				st = h2.srv.ScrubStatus()
				return !st.UpToDate.IsZero(), fmt.Sprintf("%+v", st)
			})
			if st.Bytes != 1<<20 {
				t.Errorf("the scrub read %d bytes, want the %d of the image dated %s", st.Bytes, 1<<20, future)
			}
			if got := h2.status(a.SHA256).CheckedAt; !got.Equal(h2.clock.Now()) {
				t.Errorf("checked at %s, want now (%s): the next scrub must be an interval from now", got, h2.clock.Now())
			}
			if logs.count("in the future", a.SHA256.String(), future.Format(time.RFC3339)) != 1 {
				t.Errorf("want one line saying the date is in the future:\n%s", logs)
			}
		})
	}
}
