package main

import (
	"context"
	"encoding/json"
	"fmt"
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

// keptDownload is what a stopped server kept of a download, read from its
// data directory: the offset of its checkpoint (-1 without one), and the
// network bytes it had written (the kept blob of a gzip layer; for a raw
// layer, the image in progress up to its last block of data, which can be
// short of what was written by the zeros after it, skipped as holes).
type keptDownload struct{ checkpoint, written int64 }

func readKept(t *testing.T, data, sum string, gz bool) keptDownload {
	t.Helper()
	dir := filepath.Join(data, "partial", sum)
	k := keptDownload{checkpoint: -1}
	if b, err := os.ReadFile(filepath.Join(dir, ".checkpoint.json")); err == nil {
		var c struct{ Offset int64 }
		if err := json.Unmarshal(b, &c); err != nil {
			t.Fatalf("checkpoint %s: %v", b, err)
		}
		k.checkpoint = c.Offset
	}
	name := ".partial"
	if gz {
		name = ".blob"
	}
	if fi, err := os.Stat(filepath.Join(dir, name)); err == nil {
		k.written = fi.Size()
	}
	return k
}

// checkpointLag is how far the checkpoint of a server killed with SIGKILL
// may be behind the network bytes it had written, by what the code
// promises (pull.Puller, imagestore.Writer.Checkpoint): a checkpoint every
// 2 MiB (CheckpointBytes), and the writes wait when they get 4 times that
// past the last one (a checkpoint slowed by a busy disk, or a starved
// CPU); what was written stays in the page cache. Bytes the registry sent
// that the server had not written yet (the kernel's socket buffers, the
// pipeline's) are not the server's to keep: they are measured apart.
const checkpointLag = 4 * 2 << 20

// TestServeContinuesADownloadAfterKill9: a 512 MiB download (a raw layer,
// and a gzip layer of as much) killed with SIGKILL at 30 %, 60 % and 90 %,
// behind a byte-counting proxy: each restart continues from the checkpoint
// the last one left, which is within checkpointLag of what it had written,
// and the image served has the right sha256. On the main before this test,
// each restart began at byte 0; on a loaded machine, checkpoints fell 18 MiB
// behind (each took up to 180 ms while the writes went on).
func TestServeContinuesADownloadAfterKill9(t *testing.T) {
	for _, gz := range []bool{false, true} {
		name := map[bool]string{false: "raw", true: "gzip"}[gz]
		t.Run(name, func(t *testing.T) {
			tap := &byteTap{rate: 128 << 20}
			reg := testenv.Registry(t, devregistry.Options{RootDirectory: t.TempDir(), Middleware: tap.middleware})
			pub := publishLarge(t, reg, "big-"+name, 512<<20, gz)
			sum := pub.Fields.Get("sha256")
			size, _ := strconv.ParseInt(pub.Fields.Get("size"), 10, 64)
			if gz {
				size, _ = strconv.ParseInt(pub.Fields.Get("archive-size"), 10, 64)
			}
			data := t.TempDir()
			args := []string{"--data", data, "--os-images", writeFile(t, "os-images.yaml", osImagesDocFor(map[string]devregistry.Published{"big": pub})),
				"-f", writeFile(t, "mgmt.yaml", hostileMgmt), "--output-file", filepath.Join(t.TempDir(), "served.yaml")}
			addr := freeAddr(t)

			var last keptDownload
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
				k := readKept(t, data, sum, gz)
				starts := tap.startsSince(requestsBefore)
				report = append(report, fmt.Sprintf("run %d: from byte %d, sent %d, killed with %d sent, %d written, checkpoint at %d",
					i+1, starts[0], tap.sentSince(requestsBefore), tap.reached.Load(), k.written, k.checkpoint))
				if i > 0 && starts[0] != last.checkpoint {
					t.Errorf("restart %d continued from byte %d, not from the checkpoint the last run left at %d", i, starts[0], last.checkpoint)
				}
				if k.checkpoint < k.written-checkpointLag {
					t.Errorf("run %d was killed with %d network bytes written and its checkpoint at %d: more than %d behind", i+1, k.written, k.checkpoint, checkpointLag)
				}
				last = k
			}

			requestsBefore := tap.requests()
			d := startServe(t, addr, args...)
			testenv.Eventually(t, "the image served", 120*time.Second, func() (bool, string) {
				got, code := sha256Of(t, d.url(imagePath(pub)))
				return code == 200 && got == sum, d.statusPage() + d.stderr.String()
			})
			from := tap.startsSince(requestsBefore)[0]
			report = append(report, fmt.Sprintf("last run: from byte %d, sent %d", from, tap.sentSince(requestsBefore)))
			t.Logf("%s blob of %d bytes:\n%s\ntotal sent %d (%.2fx the blob)", name, size, strings.Join(report, "\n"), tap.sent.Load(), float64(tap.sent.Load())/float64(size))
			if from != last.checkpoint {
				t.Errorf("the last run continued from byte %d, not from the checkpoint at %d", from, last.checkpoint)
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
// (a rollout) records a checkpoint at the exact point it stopped (every
// network byte it received), and the next start continues from there: the
// registry is asked for the rest only. What the registry sent that the
// server never read (it sat in the kernel's socket buffers when the
// connection closed) is sent again, and nothing else.
func TestServeContinuesADownloadAfterSIGTERM(t *testing.T) {
	for _, gz := range []bool{false, true} {
		name := map[bool]string{false: "raw", true: "gzip"}[gz]
		t.Run(name, func(t *testing.T) {
			tap := &byteTap{rate: 32 << 20}
			reg := testenv.Registry(t, devregistry.Options{RootDirectory: t.TempDir(), Middleware: tap.middleware})
			pub := publishLarge(t, reg, "rollout-"+name, 64<<20, gz)
			sum := pub.Fields.Get("sha256")
			size, _ := strconv.ParseInt(pub.Fields.Get("size"), 10, 64)
			if gz {
				size, _ = strconv.ParseInt(pub.Fields.Get("archive-size"), 10, 64)
			}
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
			sent := tap.reached.Load()
			if code := d.cmd.ProcessState.ExitCode(); code != 0 || !strings.Contains(d.stderr.String(), "its partial file is kept") {
				t.Fatalf("exit %d after SIGTERM:\n%s", code, d.stderr.String())
			}
			var stop struct{ ReceivedBytes, CheckpointBytes int64 }
			logLine(t, d.stderr.String(), "partial download kept for the next attempt", &stop)
			k := readKept(t, data, sum, gz)
			if stop.CheckpointBytes != stop.ReceivedBytes || k.checkpoint != stop.ReceivedBytes {
				t.Errorf("stopped with %d network bytes received, but checkpointed %d (the checkpoint file says %d): want the exact stop point", stop.ReceivedBytes, stop.CheckpointBytes, k.checkpoint)
			}
			if gz && k.written != k.checkpoint {
				t.Errorf("the kept blob has %d bytes, its checkpoint says %d", k.written, k.checkpoint)
			}

			requestsBefore := tap.requests()
			d = startServe(t, addr, args...)
			testenv.Eventually(t, "the image served", 60*time.Second, func() (bool, string) {
				got, code := sha256Of(t, d.url(imagePath(pub)))
				return code == 200 && got == sum, d.statusPage() + d.stderr.String()
			})
			from := tap.startsSince(requestsBefore)[0]
			t.Logf("the registry sent %d bytes before SIGTERM, the server received %d and checkpointed %d; continued from byte %d, %d bytes sent after",
				sent, stop.ReceivedBytes, k.checkpoint, from, tap.sentSince(requestsBefore))
			if from != k.checkpoint {
				t.Errorf("continued from byte %d, not from the checkpoint at %d", from, k.checkpoint)
			}
			// Sent again: what the kernel held for a server that never read
			// it, at most its socket buffers (both ends), and the one write
			// of the registry in progress.
			if buffers, ok := socketBuffers(); !ok {
				t.Logf("the kernel's socket buffer sizes cannot be read: the bytes sent again are not bounded")
			} else if again := sent - from; again > buffers+256<<10 {
				t.Errorf("%d bytes sent again after SIGTERM: more than the kernel's socket buffers (%d) and one write hold", again, buffers)
			}
		})
	}
}

// socketBuffers is the most a TCP connection on loopback can hold in
// flight: the largest receive buffer plus the largest send buffer.
func socketBuffers() (int64, bool) {
	var total int64
	for _, f := range []string{"/proc/sys/net/ipv4/tcp_rmem", "/proc/sys/net/ipv4/tcp_wmem"} {
		b, err := os.ReadFile(f)
		fields := strings.Fields(string(b))
		if err != nil || len(fields) != 3 {
			return 0, false
		}
		n, err := strconv.ParseInt(fields[2], 10, 64)
		if err != nil {
			return 0, false
		}
		total += n
	}
	return total, true
}

// logLine decodes into v the first JSON log line of stderr whose message is
// msg.
func logLine(t *testing.T, stderr, msg string, v any) {
	t.Helper()
	for _, line := range strings.Split(stderr, "\n") {
		var m struct{ Msg string }
		if json.Unmarshal([]byte(line), &m) == nil && m.Msg == msg {
			if err := json.Unmarshal([]byte(line), v); err != nil {
				t.Fatalf("log line %s: %v", line, err)
			}
			return
		}
	}
	t.Fatalf("no log line %q:\n%s", msg, stderr)
}
