package server

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sylva-projects/osimages/internal/devregistry"
	"github.com/sylva-projects/osimages/internal/fill"
	"github.com/sylva-projects/osimages/internal/imagehttp"
	"github.com/sylva-projects/osimages/internal/imagestore"
	"github.com/sylva-projects/osimages/internal/oci"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/pull"
	"github.com/sylva-projects/osimages/internal/servedset"
	"github.com/sylva-projects/osimages/internal/testenv"
)

// logLines is a JSON logger whose lines a test reads.
type logLines struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logLines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logLines) logger() *slog.Logger { return slog.New(slog.NewJSONHandler(l, nil)) }

// count is the number of lines holding every one of subs.
func (l *logLines) count(subs ...string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, line := range strings.Split(l.buf.String(), "\n") {
		all := line != ""
		for _, s := range subs {
			all = all && strings.Contains(line, s)
		}
		if all {
			n++
		}
	}
	return n
}

func (l *logLines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// attempts is the attempt counter of an image.
func (h *harness) attempts(sum osimage.SHA256) int {
	h.srv.mu.Lock()
	defer h.srv.mu.Unlock()
	if img, ok := h.srv.images[sum]; ok {
		return img.Attempts
	}
	return -1
}

func (h *harness) status(sum osimage.SHA256) imagehttp.Status {
	statuses, _ := h.srv.Statuses()
	for _, st := range statuses {
		if st.SHA256 == sum {
			return st
		}
	}
	return imagehttp.Status{}
}

// TestShutdownEndsDownloads: cancelling Run during a download ends it at
// once, puts the image back in the queue without counting an attempt, and
// never claims it again (today's main looped, claiming it a million times).
func TestShutdownEndsDownloads(t *testing.T) {
	src := newFakeSource()
	a := src.add("ubuntu-a", []byte("held in the middle of its download"), true)
	b := src.add("ubuntu-b", []byte("another, held too"), true)
	logs := &logLines{}
	dir := t.TempDir()
	h := start(t, dir, src, func(c *Config) { c.Logger = logs.logger() })
	h.want(a, b)
	h.waitPhase(a.SHA256, PhaseDownloading)
	h.waitPhase(b.SHA256, PhaseDownloading)

	start := time.Now()
	h.cancel()
	select {
	case <-h.done:
	case <-time.After(5 * time.Second):
		t.Fatalf("Run still running 5s after its context ended; %d pulls so far", src.pulls.Load())
	}
	t.Logf("Run returned %v after the cancel", time.Since(start))
	if n := src.pulls.Load(); n != 2 {
		t.Errorf("%d pulls: a cancelled download was claimed again", n)
	}
	for _, w := range []servedset.Wanted{a, b} {
		if st := h.status(w.SHA256); st.Phase != PhaseQueued || h.attempts(w.SHA256) != 0 {
			t.Errorf("%s: phase %s, %d attempts; want queued with the cancelled attempt not counted", w.Key, st.Phase, h.attempts(w.SHA256))
		}
	}
	if n := logs.count("download failed"); n != 0 {
		t.Errorf("a cancelled download was logged as failed:\n%s", logs)
	}
	if n := logs.count("interrupted by shutdown"); n != 2 {
		t.Errorf("%d shutdown lines, want one per download:\n%s", n, logs)
	}
	if left, _ := os.ReadDir(filepath.Join(dir, "tmp")); len(left) != 0 {
		t.Errorf("files left in tmp/: %v", left)
	}
	// Kept for the next start, which continues what was checkpointed.
	for _, w := range []servedset.Wanted{a, b} {
		if _, err := os.Stat(filepath.Join(dir, "partial", w.SHA256.String())); err != nil {
			t.Errorf("%s: the partial download is not kept for the next start: %v", w.Key, err)
		}
	}
}

// hostileSetup is a real registry with fault injection and a real puller.
type hostileSetup struct {
	reg    *devregistry.Registry
	faults *devregistry.Faults
	puller *pull.Puller
}

func newHostileSetup(t *testing.T) hostileSetup {
	t.Helper()
	faults := &devregistry.Faults{}
	reg := testenv.Registry(t, devregistry.Options{RootDirectory: t.TempDir(), Middleware: faults.Middleware})
	client, err := oci.NewClient(oci.Options{Insecure: true, RegistryConfig: emptyDockerConfig(t)})
	if err != nil {
		t.Fatal(err)
	}
	return hostileSetup{reg: reg, faults: faults, puller: &pull.Puller{OCI: client, Backoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond}}
}

func emptyDockerConfig(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.json")
	if err := os.WriteFile(path, []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// publish pushes img under dib/<key>:1.0 and returns its record.
func (s hostileSetup) publish(t *testing.T, key string, img devregistry.DiskImage) servedset.Wanted {
	t.Helper()
	img.Repository, img.Tag = "dib/"+key, "1.0"
	p, err := s.reg.Publish(context.Background(), img)
	if err != nil {
		t.Fatal(err)
	}
	fields := p.Fields.Clone()
	fields[osimage.FieldURI] = "oci://" + p.Ref
	sha, err := fields.SHA256()
	if err != nil {
		t.Fatal(err)
	}
	return servedset.Wanted{SHA256: sha, Key: key, Desc: fields.Descriptor(), SelectedBy: []string{"test"}}
}

func (s hostileSetup) start(t *testing.T, dir string, tweak func(*Config)) *harness {
	t.Helper()
	return start(t, dir, newFakeSource(), func(c *Config) {
		c.Pull = fill.PullWith(func() *pull.Puller { return s.puller }, nil)
		if tweak != nil {
			tweak(c)
		}
	})
}

// TestSlowDownloadGivesWay: with one slot, an image trickled by its
// registry gives way to the image queued behind it, without a failed
// attempt, and gets the slot back once the queue is empty.
func TestSlowDownloadGivesWay(t *testing.T) {
	s := newHostileSetup(t)
	slow := s.publish(t, "a-trickle", devregistry.DiskImage{Content: devregistry.DiskContent(1<<20, 1), Gzip: true})
	good := s.publish(t, "b-good", devregistry.DiskImage{Content: devregistry.DiskContent(1<<20, 2), Gzip: true})
	s.faults.Set("dib/a-trickle", devregistry.Blobs, devregistry.Trickle(1000, 50*time.Millisecond))
	logs := &logLines{}
	h := s.start(t, t.TempDir(), func(c *Config) {
		c.Concurrency = 1
		c.StallTimeout = time.Second
		c.MinRate = 1 << 20
		c.Logger = logs.logger()
	})
	h.want(slow, good)
	h.waitPhase(good.SHA256, PhaseReady)
	if got, _ := h.get(imageURL(good)); got.StatusCode != 200 {
		t.Errorf("good image: %d", got.StatusCode)
	}
	if n := logs.count("download gave way to the queue", slow.SHA256.String(), "below --min-rate 1.0 MiB/s"); n != 1 {
		t.Errorf("%d give-way lines for the trickled image, want 1:\n%s", n, logs)
	}
	// Alone in the queue, the slow image has its slot back, and keeps it.
	h.waitPhase(slow.SHA256, PhaseDownloading)
	if n := h.attempts(slow.SHA256); n != 1 {
		t.Errorf("the slow image has %d attempts, want 1: giving way is not a failed attempt", n)
	}
	if n := logs.count("download failed"); n != 0 {
		t.Errorf("giving way was logged as a failure:\n%s", logs)
	}
}

// TestHostileSourcesNeverStarveTheQueue: two slots, two images whose
// registry stalls (after the headers, mid-blob) or trickles, and a good
// image queued behind them: the good one is served within seconds.
func TestHostileSourcesNeverStarveTheQueue(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fault devregistry.Fault
		what  devregistry.Target
	}{
		{"stall after headers", devregistry.StallAfterHeaders(), devregistry.Blobs},
		{"stall mid-blob", devregistry.StallAfter(64 << 10), devregistry.Blobs},
		{"stalled manifest", devregistry.StallAfterHeaders(), devregistry.Manifests},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newHostileSetup(t)
			stalled := s.publish(t, "a-stall", devregistry.DiskImage{Content: devregistry.DiskContent(1<<20, 1), Gzip: true})
			trickled := s.publish(t, "b-trickle", devregistry.DiskImage{Content: devregistry.DiskContent(1<<20, 2), Gzip: true})
			good := s.publish(t, "c-good", devregistry.DiskImage{Content: devregistry.DiskContent(2<<20, 3), Gzip: true})
			s.faults.Set("dib/a-stall", tc.what, tc.fault)
			s.faults.Set("dib/b-trickle", devregistry.Blobs, devregistry.Trickle(1, 20*time.Millisecond))
			h := s.start(t, t.TempDir(), func(c *Config) {
				c.Concurrency = 2
				c.StallTimeout = time.Second
				c.MinRate = 64 << 10
			})
			began := time.Now()
			h.want(stalled, trickled, good)
			h.waitPhase(stalled.SHA256, PhaseDownloading)
			h.waitPhase(good.SHA256, PhaseReady)
			t.Logf("good image ready %v after the start", time.Since(began))
			h.waitPhase(stalled.SHA256, PhaseFailed)
			st := h.status(stalled.SHA256)
			if !strings.Contains(st.Reason, "stalled: no byte received for 1s (--stall-timeout)") || !st.NextTry.After(h.clock.Now()) {
				t.Errorf("stalled image: reason %q, next try %v; want a stall, retried later", st.Reason, st.NextTry)
			}
			// Retried with backoff: the next attempt fails the same way.
			h.clock.advance(time.Minute)
			h.srv.signal(h.srv.kick)
			testenv.Eventually(t, "a second attempt", 10*time.Second, func() (bool, string) {
				return h.attempts(stalled.SHA256) == 2 && h.status(stalled.SHA256).Phase == PhaseFailed, fmt.Sprint(h.status(stalled.SHA256))
			})
		})
	}
}

// TestFieldRules: size and archive-size are decimal integers of bytes, and
// oci-manifest-digest is an OCI digest; any other value fails the image
// with an error naming it and the field, before a byte is pulled.
func TestFieldRules(t *testing.T) {
	src := newFakeSource()
	var bad []servedset.Wanted
	for i, tc := range []struct{ field, value, want string }{
		{"size", "lots", `os_images.bad-0.size "lots" is not a decimal integer`},
		{"size", "2.097152e6", `os_images.bad-1.size "2.097152e6" is not a decimal integer`},
		{"size", "0x200000", `os_images.bad-2.size "0x200000" is not a decimal integer`},
		{"size", "-5", `os_images.bad-3.size "-5" is negative`},
		{"size", "99999999999999999999", `os_images.bad-4.size "99999999999999999999" is larger than`},
		{"archive-size", "99999999999999999999", `os_images.bad-5.archive-size "99999999999999999999" is larger than`},
		{"size", "17179869184", "os_images.bad-6.size is 16.0 GiB (17179869184 bytes), more than --max-image-size 1.0 GiB"},
		{"oci-manifest-digest", "sha256:not-hex", `os_images.bad-7.oci-manifest-digest "sha256:not-hex" is not an OCI digest`},
	} {
		w := src.add(fmt.Sprintf("bad-%d", i), []byte(tc.value), false)
		w.Desc = osimage.Image{osimage.FieldFilename: w.Desc.Filename, osimage.FieldURI: w.Desc.URI, osimage.FieldMD5: w.Desc.MD5, tc.field: tc.value}.Descriptor()
		bad = append(bad, w)
		t.Run(tc.value, func(t *testing.T) {
			h := start(t, t.TempDir(), src, func(c *Config) { c.MaxImageSize = 1 << 30 })
			before := src.pulls.Load()
			h.want(w)
			h.waitPhase(w.SHA256, PhaseFailed)
			if st := h.status(w.SHA256); !strings.Contains(st.Reason, tc.want) {
				t.Errorf("reason %q, want %q", st.Reason, tc.want)
			}
			if src.pulls.Load() != before {
				t.Error("an image with a malformed field was pulled")
			}
		})
	}
}

// TestGzipBombNeverStarvesAnotherDownload: on a small disk, an image
// without a size whose layer is a gzip bomb is cut at --max-image-size, and
// the good image downloading beside it is stored. On today's main the bomb
// filled the disk and the good image failed with ENOSPC.
func TestGzipBombNeverStarvesAnotherDownload(t *testing.T) {
	dir := testenv.SmallFS(t, 48<<20)
	s := newHostileSetup(t)
	bomb := s.publish(t, "a-bomb", devregistry.DiskImage{Gzip: true, Layer: devregistry.GzipBomb(512 << 20)})
	bomb.Desc.Size = 0 // nothing declared: the bound is --max-image-size
	good := s.publish(t, "b-good", devregistry.DiskImage{Content: devregistry.DiskContent(8<<20, 5), Gzip: true})
	// The good image comes slowly, so that the bomb runs all along.
	s.faults.Set("dib/b-good", devregistry.Blobs, devregistry.Trickle(64<<10, 20*time.Millisecond))
	h := s.start(t, dir, func(c *Config) {
		c.Concurrency = 2
		c.FreeSpaceMargin = 0
		c.MaxImageSize = 16 << 20
	})
	h.want(bomb, good)
	h.waitPhase(bomb.SHA256, PhaseFailed)
	if st := h.status(bomb.SHA256); !strings.Contains(st.Reason, "the image declares no size, so it is bounded by --max-image-size or, when less, by the space that was free (16.0 MiB)") {
		t.Errorf("bomb: %q", st.Reason)
	}
	h.waitPhase(good.SHA256, PhaseReady)
	if st := h.status(good.SHA256); st.Phase != PhaseReady {
		t.Errorf("good image: %s %q", st.Phase, st.Reason)
	}
	for _, sub := range []string{"tmp", "partial"} {
		if left, _ := os.ReadDir(filepath.Join(dir, sub)); len(left) != 0 {
			t.Errorf("the bomb left %v in %s/", left, sub)
		}
	}
}

// TestReservationHoldsTheBound: an image without a size is bounded by
// --max-image-size or, when less, by the space there is: a small one is
// served on a volume smaller than --max-image-size, and one larger than the
// space is cut at it, with a message that says why, leaving nothing behind.
func TestReservationHoldsTheBound(t *testing.T) {
	src := newFakeSource()
	small := src.add("no-size", []byte("small, but nobody says so"), false)
	small.Desc.Size = 0
	large := src.add("no-size-large", devregistry.DiskContent(4<<20, 3), false)
	large.Desc.Size, large.Desc.ArchiveSize = 0, 0
	dir := t.TempDir()
	h := start(t, dir, src, func(c *Config) {
		c.MaxImageSize = 1 << 30
		c.MaxStorage = 1 << 20
		c.Concurrency = 1
	})
	h.want(small)
	h.waitPhase(small.SHA256, PhaseReady)
	h.want(small, large)
	h.waitPhase(large.SHA256, PhaseFailed)
	if st := h.status(large.SHA256); !strings.Contains(st.Reason, "the image declares no size") || !strings.Contains(st.Reason, "larger than the bound") {
		t.Errorf("reason %q", st.Reason)
	}
	for _, sub := range []string{"tmp", "partial"} {
		if left, _ := os.ReadDir(filepath.Join(dir, sub)); len(left) != 0 {
			t.Errorf("the cut download left %v in %s/", left, sub)
		}
	}
}

// TestStalledClientIsCut: a client that stops reading an image is cut
// after SendTimeout, while a slow but steady one gets the whole file.
func TestStalledClientIsCut(t *testing.T) {
	src := newFakeSource()
	content := devregistry.DiskContent(64<<20, 8)
	a := src.add("big", content, false)
	// SendTimeout is long enough that a steady reader on a busy machine is
	// never without progress for that long; the stalled one stops for
	// three times as long.
	const sendTimeout = 2 * time.Second
	h := start(t, t.TempDir(), src, func(c *Config) { c.SendTimeout = sendTimeout })
	h.want(a)
	h.waitPhase(a.SHA256, PhaseReady)
	addr := strings.TrimPrefix(h.http.URL, "http://")
	dial := func() net.Conn {
		// A small receive buffer, set before connecting, so that little
		// waits in the kernel.
		d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
			return c.Control(func(fd uintptr) { _ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 64<<10) })
		}}
		c, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", imageURL(a))
		return c
	}
	body := func(c net.Conn, pace time.Duration) (int64, string) {
		c.SetReadDeadline(time.Now().Add(30 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		digest := sha256.New()
		var n int64
		buf := make([]byte, 1<<20)
		for {
			m, err := io.ReadFull(resp.Body, buf)
			n += int64(m)
			digest.Write(buf[:m])
			if err != nil {
				break
			}
			time.Sleep(pace)
		}
		return n, hex.EncodeToString(digest.Sum(nil))
	}

	// Steady at about 40 MiB/s or less: 1.6 s in all at least, each pause
	// far below SendTimeout.
	slow := dial()
	defer slow.Close()
	began := time.Now()
	if n, sum := body(slow, 25*time.Millisecond); n != int64(len(content)) || sum != a.SHA256.String() {
		t.Fatalf("a steady client got %d bytes (sha256 %s) in %v", n, sum, time.Since(began))
	}
	t.Logf("a steady client got the image in %v", time.Since(began))

	stalled := dial()
	defer stalled.Close()
	time.Sleep(3 * sendTimeout)
	if n, _ := body(stalled, 0); n >= int64(len(content)) {
		t.Fatalf("a client that stopped reading for %v still got all %d bytes: it is never cut", 3*sendTimeout, n)
	} else {
		t.Logf("a client that stopped reading got %d of %d bytes before the cut", n, len(content))
	}
}

// TestKeptIsLoggedOncePerChange: a deselected image kept by references is
// logged when it starts being kept and when its referrers change, not at
// every collection.
func TestKeptIsLoggedOncePerChange(t *testing.T) {
	src := newFakeSource()
	a := src.add("kept", []byte("kept bytes"), false)
	refs := &staticRefs{}
	logs := &logLines{}
	h := start(t, t.TempDir(), src, func(c *Config) { c.References = refs; c.Logger = logs.logger() })
	h.want(a)
	h.waitPhase(a.SHA256, PhaseReady)
	h.want()
	h.clock.advance(2 * time.Hour)
	refs.set(true, map[osimage.SHA256][]string{a.SHA256: {"Metal3MachineTemplate wc1/t1"}})
	for range 20 {
		h.srv.CollectGarbage()
	}
	refs.set(true, map[osimage.SHA256][]string{a.SHA256: {"Metal3MachineTemplate wc1/t1", "Metal3MachineTemplate wc1/t2"}})
	for range 20 {
		h.srv.CollectGarbage()
	}
	if n := logs.count("image kept", a.SHA256.String()); n != 2 {
		t.Errorf("%d \"image kept\" lines for 40 collections and one change of referrers, want 2:\n%s", n, logs)
	}
}

// TestTamperedImageIsDownloadedAgain: a stored file replaced by a symlink
// is never served; the store drops it and the server downloads it again.
func TestTamperedImageIsDownloadedAgain(t *testing.T) {
	src := newFakeSource()
	content := []byte("the verified bytes")
	a := src.add("tampered", content, false)
	dir := t.TempDir()
	h := start(t, dir, src, nil)
	h.want(a)
	h.waitPhase(a.SHA256, PhaseReady)
	path := filepath.Join(dir, "images", a.SHA256.String(), a.Desc.Filename)
	other := filepath.Join(t.TempDir(), "other")
	os.WriteFile(other, []byte("not the verified!!"), 0o644)
	os.Remove(path)
	if err := os.Symlink(other, path); err != nil {
		t.Fatal(err)
	}
	resp, body := h.get(imageURL(a))
	if resp.StatusCode != http.StatusServiceUnavailable || bytes.Contains(body, []byte("not the verified")) {
		t.Fatalf("tampered image: %d %q; want 503 while it is downloaded again", resp.StatusCode, body)
	}
	h.waitPhase(a.SHA256, PhaseReady)
	if resp, body := h.get(imageURL(a)); resp.StatusCode != 200 || !bytes.Equal(body, content) {
		t.Fatalf("after the new download: %d %q", resp.StatusCode, body)
	}
	if src.pulls.Load() != 2 {
		t.Errorf("%d pulls, want 2", src.pulls.Load())
	}
}

// tightStore is a store whose disk has exactly free bytes left.
type tightStore struct {
	*imagestore.Store
	free uint64
}

func (s tightStore) Available() (uint64, error) { return s.free, nil }

// TestZeroValuesAreHonoured: a zero margin and a zero grace period mean
// zero, not the defaults.
func TestZeroValuesAreHonoured(t *testing.T) {
	src := newFakeSource()
	content := []byte("exactly as large as the free space")
	a := src.add("exact", content, false)
	h := start(t, t.TempDir(), src, func(c *Config) {
		c.FreeSpaceMargin = 0
		c.GCGrace = 0
		// Free space for the image and its archive, and not a byte more.
		c.Store = tightStore{Store: c.Store.(*imagestore.Store), free: uint64(2 * len(content))}
	})
	h.want(a)
	h.waitPhase(a.SHA256, PhaseReady)
	h.want()
	h.srv.CollectGarbage()
	if _, ok := h.store.Get(a.SHA256); ok {
		t.Error("--gc-grace 0 kept a deselected image")
	}
}

// TestSpaceHeldByAnotherDownloadIsWaitedFor: when the disk can hold an
// image but not while another download holds its reservation, the image
// waits for it, queued, and is downloaded once it ends; it never fails
// for lack of space that another image holds.
func TestSpaceHeldByAnotherDownloadIsWaitedFor(t *testing.T) {
	src := newFakeSource()
	a := src.add("a-first", bytes.Repeat([]byte("a"), 1000), true)
	b := src.add("b-second", bytes.Repeat([]byte("b"), 1000), false)
	h := start(t, t.TempDir(), src, func(c *Config) {
		c.FreeSpaceMargin = 0
		// Room for one image and its archive (2000 bytes), not two.
		c.Store = tightStore{Store: c.Store.(*imagestore.Store), free: 3000}
	})
	h.want(a)
	h.waitPhase(a.SHA256, PhaseDownloading)
	h.want(a, b)
	testenv.Eventually(t, "b waiting for a's space", 10*time.Second, func() (bool, string) {
		st := h.status(b.SHA256)
		return st.Phase == PhaseQueued && strings.Contains(st.Reason, "waiting for disk space"), fmt.Sprint(st)
	})
	if n := h.attempts(b.SHA256); n != 0 {
		t.Errorf("waiting for space counted %d attempts", n)
	}
	src.release(a.SHA256)
	h.waitPhase(a.SHA256, PhaseReady)
	h.waitPhase(b.SHA256, PhaseReady)
	if pulls := src.pulls.Load(); pulls != 2 {
		t.Errorf("%d pulls, want 2: b is pulled once, when the space is there", pulls)
	}
}
