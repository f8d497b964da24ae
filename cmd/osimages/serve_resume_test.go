package main

import (
	"context"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sylva-projects/osimages/internal/devregistry"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/testenv"
)

// byteTap is a byte-counting proxy in front of the registry's blobs: it
// counts the bytes the registry sends, notes where each request starts (its
// Range), and paces them at rate bytes a second, so that a test can kill
// the server at a chosen point of the download.
type byteTap struct {
	rate    int64
	sent    atomic.Int64
	reached atomic.Int64 // the furthest offset sent
	mu      sync.Mutex
	starts  []int64         // the first offset of each request
	sents   []*atomic.Int64 // the bytes sent in answer to each request
}

func (b *byteTap) middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet || !strings.Contains(r.URL.Path, "/blobs/") {
			next.ServeHTTP(w, r)
			return
		}
		var start int64
		if rng, ok := strings.CutPrefix(r.Header.Get("Range"), "bytes="); ok {
			first, _, _ := strings.Cut(rng, "-")
			start, _ = strconv.ParseInt(first, 10, 64)
		}
		sent := &atomic.Int64{}
		b.mu.Lock()
		b.starts = append(b.starts, start)
		b.sents = append(b.sents, sent)
		b.mu.Unlock()
		next.ServeHTTP(&pacedResponse{ResponseWriter: w, tap: b, off: start, began: time.Now(), mine: sent}, r)
	})
}

// startsSince are the first offsets of the requests after the first n.
func (b *byteTap) startsSince(n int) []int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]int64(nil), b.starts[n:]...)
}

// sentSince is what was sent in answer to the requests after the first n
// (the answer to an earlier one, to a process since killed, may still be
// written into its dead connection).
func (b *byteTap) sentSince(n int) int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	var total int64
	for _, s := range b.sents[n:] {
		total += s.Load()
	}
	return total
}

func (b *byteTap) requests() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.starts)
}

type pacedResponse struct {
	http.ResponseWriter
	tap   *byteTap
	off   int64
	sent  int64
	began time.Time
	mine  *atomic.Int64
}

func (w *pacedResponse) Write(p []byte) (int, error) {
	written := 0
	for len(p) > 0 {
		n, err := w.ResponseWriter.Write(p[:min(len(p), 256<<10)])
		written += n
		w.sent += int64(n)
		w.mine.Add(int64(n))
		w.tap.sent.Add(int64(n))
		w.tap.reached.Store(w.off + w.sent)
		if err != nil {
			return written, err
		}
		p = p[n:]
		if ahead := time.Duration(w.sent*int64(time.Second)/w.tap.rate) - time.Since(w.began); ahead > 0 {
			time.Sleep(ahead)
		}
	}
	return written, nil
}

// publishLarge publishes an image of size bytes, streamed from a file,
// under dib/<key>, selected by hostileMgmt: DiskContent, or, for a gzip
// layer, random bytes, so that the layer is as large as the image.
func publishLarge(t *testing.T, reg *devregistry.Registry, key string, size int64, gz bool) devregistry.Published {
	t.Helper()
	path := filepath.Join(t.TempDir(), key+".raw")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if gz {
		_, err = io.CopyN(f, rand.NewChaCha8([32]byte{42}), size)
	} else {
		err = devregistry.WriteDiskContent(f, size, 42)
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	p, err := reg.Publish(context.Background(), devregistry.DiskImage{
		Repository: "dib/" + key, Tag: "1.0", ContentFile: path, Gzip: gz,
		Fields: osimage.Image{"os": "debian"},
	})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestServeContinuesADownloadAfterKill9: a 512 MiB download (a raw layer,
// and a gzip layer of as much) killed with SIGKILL at 30 %, 60 % and 90 %,
// behind a byte-counting proxy: each restart continues from what
// the last one checkpointed, so that the registry sends at most the bytes
// left plus 5 % of the download, and the image served has the right
// sha256. On the main before this test, each restart began at byte 0.
func TestServeContinuesADownloadAfterKill9(t *testing.T) {
	for _, gz := range []bool{false, true} {
		name := map[bool]string{false: "raw", true: "gzip"}[gz]
		t.Run(name, func(t *testing.T) {
			tap := &byteTap{rate: 128 << 20}
			reg := testenv.Registry(t, devregistry.Options{RootDirectory: t.TempDir(), Middleware: tap.middleware})
			pub := publishLarge(t, reg, "big-"+name, 512<<20, gz)
			size, _ := strconv.ParseInt(pub.Fields.Get("size"), 10, 64)
			if gz {
				size, _ = strconv.ParseInt(pub.Fields.Get("archive-size"), 10, 64)
			}
			slack := size / 20
			data := t.TempDir()
			args := []string{"--data", data, "--os-images", writeFile(t, "os-images.yaml", osImagesDocFor(map[string]devregistry.Published{"big": pub})),
				"-f", writeFile(t, "mgmt.yaml", hostileMgmt), "--output-file", filepath.Join(t.TempDir(), "served.yaml")}
			addr := freeAddr(t)

			var lastKill int64
			var report []string
			for i, pct := range []int64{30, 60, 90} {
				requestsBefore := tap.requests()
				d := startServe(t, addr, args...)
				target := size * pct / 100
				testenv.Eventually(t, "the download at "+strconv.FormatInt(pct, 10)+" %", 120*time.Second, func() (bool, string) {
					return tap.reached.Load() >= target, d.stderr.String()
				})
				d.cmd.Process.Kill()
				<-d.done
				starts := tap.startsSince(requestsBefore)
				report = append(report, "run "+strconv.Itoa(i+1)+": from byte "+strconv.FormatInt(starts[0], 10)+
					", sent "+strconv.FormatInt(tap.sentSince(requestsBefore), 10)+", killed at "+strconv.FormatInt(tap.reached.Load(), 10))
				if i > 0 && starts[0] < lastKill-slack {
					t.Errorf("restart %d continued from byte %d, but the last run was killed at %d: more than 5 %% (%d bytes) was downloaded again", i, starts[0], lastKill, slack)
				}
				lastKill = tap.reached.Load()
			}

			requestsBefore := tap.requests()
			d := startServe(t, addr, args...)
			testenv.Eventually(t, "the image served", 120*time.Second, func() (bool, string) {
				sum, code := sha256Of(t, d.url(imagePath(pub)))
				return code == 200 && sum == pub.Fields.Get("sha256"), d.statusPage() + d.stderr.String()
			})
			sent := tap.sentSince(requestsBefore)
			report = append(report, "last run: from byte "+strconv.FormatInt(tap.startsSince(requestsBefore)[0], 10)+", sent "+strconv.FormatInt(sent, 10))
			t.Logf("%s blob of %d bytes:\n%s\ntotal sent %d (%.2fx the blob)", name, size, strings.Join(report, "\n"), tap.sent.Load(), float64(tap.sent.Load())/float64(size))
			if left := size - lastKill; sent > left+slack {
				t.Errorf("after the last kill the registry sent %d bytes; %d were left: want at most %d", sent, left, left+slack)
			}
			if !strings.Contains(d.stderr.String(), "download continued from the partial file kept") {
				t.Errorf("the last run did not log the continued download:\n%s", d.stderr.String())
			}
		})
	}
}

// TestServeDiscardsAPartialDamagedWhileDown: a byte of the partial file
// flipped while the server is down (after a SIGKILL at half the download)
// is detected at the next start, before anything is asked of the registry:
// the download starts again from byte 0 and the image served is right.
func TestServeDiscardsAPartialDamagedWhileDown(t *testing.T) {
	tap := &byteTap{rate: 64 << 20}
	reg := testenv.Registry(t, devregistry.Options{RootDirectory: t.TempDir(), Middleware: tap.middleware})
	pub := publishLarge(t, reg, "damaged", 64<<20, false)
	size, _ := strconv.ParseInt(pub.Fields.Get("size"), 10, 64)
	data := t.TempDir()
	args := []string{"--data", data, "--os-images", writeFile(t, "os-images.yaml", osImagesDocFor(map[string]devregistry.Published{"damaged": pub})),
		"-f", writeFile(t, "mgmt.yaml", hostileMgmt), "--output-file", filepath.Join(t.TempDir(), "served.yaml")}
	addr := freeAddr(t)
	d := startServe(t, addr, args...)
	partial := filepath.Join(data, "partial", pub.Fields.Get("sha256"))
	testenv.Eventually(t, "half the download checkpointed", 60*time.Second, func() (bool, string) {
		_, err := os.Stat(filepath.Join(partial, ".checkpoint.json"))
		return err == nil && tap.reached.Load() >= size/2, d.stderr.String()
	})
	d.cmd.Process.Kill()
	<-d.done
	f, err := os.OpenFile(filepath.Join(partial, ".partial"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	var b [1]byte
	f.ReadAt(b[:], 1000) // DiskContent holds random bytes there, not a hole
	b[0] ^= 0x01
	f.WriteAt(b[:], 1000)
	f.Close()

	requestsBefore := tap.requests()
	d = startServe(t, addr, args...)
	testenv.Eventually(t, "the image served", 60*time.Second, func() (bool, string) {
		sum, code := sha256Of(t, d.url(imagePath(pub)))
		return code == 200 && sum == pub.Fields.Get("sha256"), d.statusPage() + d.stderr.String()
	})
	if starts := tap.startsSince(requestsBefore); len(starts) != 1 || starts[0] != 0 {
		t.Errorf("requests after the restart start at %v, want one from byte 0", starts)
	}
	if sent := tap.sentSince(requestsBefore); sent != size {
		t.Errorf("the registry sent %d bytes after the restart, want the whole %d", sent, size)
	}
	if log := d.stderr.String(); !strings.Contains(log, "partial download discarded") || !strings.Contains(log, "does not match its checkpoint") {
		t.Errorf("the damaged partial was not reported:\n%s", log)
	}
}

// TestServeContinuesADownloadAfterSIGTERM: a download stopped by SIGTERM
// (a rollout) records a checkpoint where it stopped, and the next start
// continues from there: the registry is asked for the rest only.
func TestServeContinuesADownloadAfterSIGTERM(t *testing.T) {
	tap := &byteTap{rate: 32 << 20}
	reg := testenv.Registry(t, devregistry.Options{RootDirectory: t.TempDir(), Middleware: tap.middleware})
	pub := publishLarge(t, reg, "rollout", 64<<20, false)
	size, _ := strconv.ParseInt(pub.Fields.Get("size"), 10, 64)
	data := t.TempDir()
	args := []string{"--data", data, "--os-images", writeFile(t, "os-images.yaml", osImagesDocFor(map[string]devregistry.Published{"rollout": pub})),
		"-f", writeFile(t, "mgmt.yaml", hostileMgmt), "--output-file", filepath.Join(t.TempDir(), "served.yaml")}
	addr := freeAddr(t)
	d := startServe(t, addr, args...)
	testenv.Eventually(t, "half the download", 60*time.Second, func() (bool, string) {
		return tap.reached.Load() >= size/2, d.stderr.String()
	})
	d.cmd.Process.Signal(syscall.SIGTERM)
	<-d.done
	stoppedAt := tap.reached.Load()
	if code := d.cmd.ProcessState.ExitCode(); code != 0 || !strings.Contains(d.stderr.String(), "its partial file is kept") {
		t.Fatalf("exit %d after SIGTERM:\n%s", code, d.stderr.String())
	}
	checkpoint, err := os.ReadFile(filepath.Join(data, "partial", pub.Fields.Get("sha256"), ".checkpoint.json"))
	if err != nil {
		t.Fatal(err)
	}

	requestsBefore := tap.requests()
	d = startServe(t, addr, args...)
	testenv.Eventually(t, "the image served", 60*time.Second, func() (bool, string) {
		sum, code := sha256Of(t, d.url(imagePath(pub)))
		return code == 200 && sum == pub.Fields.Get("sha256"), d.statusPage() + d.stderr.String()
	})
	from := tap.startsSince(requestsBefore)[0]
	t.Logf("stopped with %d bytes sent, checkpoint %s; continued from byte %d, %d bytes sent after", stoppedAt, strings.TrimSpace(string(checkpoint)), from, tap.sentSince(requestsBefore))
	if from < stoppedAt-size/20 || from > stoppedAt {
		t.Errorf("continued from byte %d; the registry had sent %d before SIGTERM: want at most 5 %% of %d again", from, stoppedAt, size)
	}
}
