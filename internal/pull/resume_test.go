package pull

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sylva-projects/osimages/internal/devregistry"
	"github.com/sylva-projects/osimages/internal/imagestore"
	"github.com/sylva-projects/osimages/internal/oci"
	"github.com/sylva-projects/osimages/internal/testenv"
)

// blobTap counts the bytes of blob digest the registry sends (of every GET
// with all), records the Range of each request, and can hold a
// response once a count of bytes is sent, as a registry does when the
// server that reads it is about to die.
type blobTap struct {
	digest  string
	all     bool
	sent    atomic.Int64
	holdAt  atomic.Int64 // 0: never hold
	mu      sync.Mutex
	ranges  []string
	holding chan struct{}
}

func (b *blobTap) middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !isBlobGet(r, b.digest) && !(b.all && r.Method == http.MethodGet) {
			next.ServeHTTP(w, r)
			return
		}
		b.mu.Lock()
		b.ranges = append(b.ranges, r.Header.Get("Range"))
		b.mu.Unlock()
		next.ServeHTTP(&tapWriter{ResponseWriter: w, tap: b, ctx: r.Context()}, r)
	})
}

func (b *blobTap) requests() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.ranges...)
}

type tapWriter struct {
	http.ResponseWriter
	tap *blobTap
	ctx context.Context
}

func (w *tapWriter) Write(p []byte) (int, error) {
	if at := w.tap.holdAt.Load(); at > 0 {
		room := at - w.tap.sent.Load()
		if room <= 0 || int64(len(p)) > room {
			n, _ := w.ResponseWriter.Write(p[:max(room, 0)])
			w.tap.sent.Add(int64(n))
			w.ResponseWriter.(http.Flusher).Flush()
			close(w.tap.holding)
			<-w.ctx.Done()
			return n, w.ctx.Err()
		}
	}
	n, err := w.ResponseWriter.Write(p)
	w.tap.sent.Add(int64(n))
	return n, err
}

func (w *tapWriter) Flush() { w.ResponseWriter.(http.Flusher).Flush() }

// interrupted pulls src into a resumable writer of a store in dir until the
// registry has sent holdAt bytes of the blob, then stops the pull as a
// shutdown does and suspends the writer.
func interrupted(t *testing.T, dir string, p *Puller, src Source, tap *blobTap, holdAt int64) {
	t.Helper()
	interruptedKeeping(t, dir, p, src, tap, holdAt, true)
}

// interruptedKeeping is interrupted; keeps says whether the bytes received
// are good, and so checkpointed where the pull stopped.
func interruptedKeeping(t *testing.T, dir string, p *Puller, src Source, tap *blobTap, holdAt int64, keeps bool) {
	t.Helper()
	store, err := imagestore.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	w, err := store.Resume(src.SHA256)
	if err != nil {
		t.Fatal(err)
	}
	tap.holdAt.Store(holdAt)
	tap.holding = make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	var received atomic.Int64
	done := make(chan error, 1)
	var res Result
	go func() {
		var err error
		res, err = p.Pull(ctx, src, w, func(n, _ int64) { received.Store(n) })
		done <- err
	}()
	select {
	case <-tap.holding:
	case err := <-done:
		t.Fatalf("the pull ended before the registry held it: %v", err)
	}
	testenv.Eventually(t, "the held bytes received", 10*time.Second, func() (bool, string) {
		return received.Load() >= holdAt, ""
	})
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("interrupted pull: %v, want context.Canceled", err)
	}
	// A shutdown checkpoints the exact point it stopped at: every byte
	// the registry sent, none downloaded again.
	if keeps && (res.Reached != holdAt || res.Checkpoint != holdAt) {
		t.Errorf("stopped with %d network bytes received, checkpoint at %d; the registry sent %d", res.Reached, res.Checkpoint, holdAt)
	}
	if err := w.Suspend(); err != nil {
		t.Fatal(err)
	}
	tap.holdAt.Store(0)
}

// resumed opens the store in dir again and pulls src to its end. first is
// the first offset the pull reported (where it started), pings the reports
// at that offset before any network byte (signs of life while the kept
// bytes are checked).
func resumed(t *testing.T, dir string, p *Puller, src Source) (store *imagestore.Store, res Result, first int64, pings int) {
	t.Helper()
	store, err := imagestore.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	var w *imagestore.Writer
	w, err = store.Resume(src.SHA256)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Abort()
	first = -1
	moved := false
	res, err = p.Pull(context.Background(), src, w, func(received, _ int64) {
		switch {
		case first < 0:
			first = received
		case received != first:
			moved = true
		case !moved:
			pings++
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Commit(imagestore.Entry{MD5: res.MD5, Filename: "image.raw", Size: res.Size}); err != nil {
		t.Fatal(err)
	}
	return store, res, first, pings
}

// TestPullContinuesAfterARestart: a pull stopped at 40 % of its blob and
// continued by a new store on the same directory asks the registry for the
// rest only (one closed range from where it stopped), and the file
// committed is the image; for a gzip layer too, whose kept blob is
// decompressed again from the disk.
func TestPullContinuesAfterARestart(t *testing.T) {
	for _, gz := range []bool{false, true} {
		name := map[bool]string{false: "raw", true: "gzip"}[gz]
		t.Run(name, func(t *testing.T) {
			tap := &blobTap{}
			reg := registryWith(t, tap.middleware)
			content := devregistry.DiskContent(32<<20+5, 11)
			src, pub := publish(t, reg, "dib/resume-"+name, content, gz, nil)
			tap.digest = pub.LayerDigest.String()
			blobSize := src.ArchiveSize
			if !gz {
				blobSize = src.Size
			}
			p := fastPuller(ociClient(t, oci.Options{Insecure: true}))
			p.CheckpointInterval = 20 * time.Millisecond
			dir := t.TempDir()

			holdAt := blobSize * 4 / 10
			interrupted(t, dir, p, src, tap, holdAt)
			firstSent := tap.sent.Load()
			firstRequests := len(tap.requests())

			store, res, first, pings := resumed(t, dir, p, src)
			assertStored(t, store, content)
			if first != holdAt {
				t.Errorf("the continued pull first reported offset %d, want %d: where it starts", first, holdAt)
			}
			if want := int(holdAt / keptPing); pings != want {
				t.Errorf("%d signs of life while %d kept bytes were checked, want one per %d: %d", pings, holdAt, keptPing, want)
			}
			again := tap.sent.Load() - firstSent
			t.Logf("%s: blob of %d bytes; %d sent before the stop, %d after it; kept %d", name, blobSize, firstSent, again, res.Kept)
			if res.Kept != holdAt || again != blobSize-holdAt || res.NetworkBytes != again {
				t.Errorf("kept %d, registry sent %d more, network bytes %d; want %d kept and the %d left", res.Kept, again, res.NetworkBytes, holdAt, blobSize-holdAt)
			}
			if reqs := tap.requests()[firstRequests:]; len(reqs) != 1 || !strings.HasPrefix(reqs[0], "bytes="+strconv.FormatInt(holdAt, 10)+"-") {
				t.Errorf("requests after the restart: %q, want one range from byte %d", reqs, holdAt)
			}
			if entries, _ := os.ReadDir(filepath.Join(dir, "partial")); len(entries) != 0 {
				t.Errorf("partial/ still holds %v after the commit", entries)
			}
		})
	}
}

// TestPullDiscardsADamagedPartial: a kept partial changed (one byte) or
// cut while the server was down is detected before anything is asked of
// the registry, and the pull starts again from byte 0, with no Range, and
// commits the right file.
func TestPullDiscardsADamagedPartial(t *testing.T) {
	for _, tc := range []struct {
		name   string
		gz     bool
		damage func(path string) error
	}{
		{"raw flipped", false, flipByte},
		{"gzip flipped", true, flipByte},
		{"raw cut", false, cutInHalf},
		{"gzip cut", true, cutInHalf},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tap := &blobTap{}
			reg := registryWith(t, tap.middleware)
			content := devregistry.DiskContent(16<<20, 12)
			src, pub := publish(t, reg, "dib/damaged", content, tc.gz, nil)
			tap.digest = pub.LayerDigest.String()
			blobSize := src.ArchiveSize
			kept := ".partial"
			if !tc.gz {
				blobSize = src.Size
			} else {
				kept = ".blob"
			}
			p := fastPuller(ociClient(t, oci.Options{Insecure: true}))
			dir := t.TempDir()
			interrupted(t, dir, p, src, tap, blobSize/2)
			if err := tc.damage(filepath.Join(dir, "partial", string(src.SHA256), kept)); err != nil {
				t.Fatal(err)
			}
			firstSent, firstRequests := tap.sent.Load(), len(tap.requests())

			store, res, _, _ := resumed(t, dir, p, src)
			assertStored(t, store, content)
			t.Logf("discarded: %s", res.KeptDiscarded)
			if !strings.Contains(res.KeptDiscarded, "does not match its checkpoint") || res.Kept != 0 || res.Restarts != 1 {
				t.Errorf("result %+v: want the kept partial discarded, one restart, nothing kept", res)
			}
			if again := tap.sent.Load() - firstSent; again != blobSize {
				t.Errorf("registry sent %d bytes after the restart, want the whole blob, %d", again, blobSize)
			}
			if reqs := tap.requests()[firstRequests:]; len(reqs) != 1 || reqs[0] != "" {
				t.Errorf("requests after the restart: %q, want one, without a Range", reqs)
			}
		})
	}
}

// flipByte inverts a byte near the start of a file that holds data there.
func flipByte(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	var b [1]byte
	if _, err := f.ReadAt(b[:], 1000); err != nil {
		return err
	}
	b[0] ^= 0xff
	_, err = f.WriteAt(b[:], 1000)
	return err
}

func cutInHalf(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	return os.Truncate(path, fi.Size()/2)
}

// TestPullContinuesAGzipDownloadOfUnknownLength: an HTTP gzip source that
// declares no archive-size keeps its blob too, and continues after a
// restart with a range from where it stopped.
func TestPullContinuesAGzipDownloadOfUnknownLength(t *testing.T) {
	content := devregistry.DiskContent(24<<20, 13)
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(content)
	zw.Close()
	tap := &blobTap{all: true}
	url := newQuietServer(t, tap.middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.ServeContent(w, r, "img.gz", time.Time{}, bytes.NewReader(gz.Bytes()))
	})))
	src := Source{URI: url + "/img.gz", SHA256: shaHex(content), Compression: "gz", Size: int64(len(content))}
	p := fastPuller(nil)
	p.HTTP = http.DefaultClient
	p.CheckpointInterval = 20 * time.Millisecond
	dir := t.TempDir()
	holdAt := int64(gz.Len() / 2)
	interrupted(t, dir, p, src, tap, holdAt)
	firstSent, firstRequests := tap.sent.Load(), len(tap.requests())

	store, res, _, _ := resumed(t, dir, p, src)
	assertStored(t, store, content)
	if again := tap.sent.Load() - firstSent; res.Kept != holdAt || again != int64(gz.Len())-holdAt {
		t.Errorf("kept %d, sent %d after the restart; want %d kept and the %d left", res.Kept, again, holdAt, int64(gz.Len())-holdAt)
	}
	if reqs := tap.requests()[firstRequests:]; len(reqs) == 0 || !strings.HasPrefix(reqs[0], "bytes="+strconv.FormatInt(holdAt, 10)+"-") {
		t.Errorf("requests after the restart: %q, want ranges from byte %d", reqs, holdAt)
	}
}

// TestPullStartsAgainWhenTheServerWillNotContinue: bytes kept and checked,
// but a server that ignores the Range (or answers another one) cannot
// continue them: the pull starts again from byte 0, and the file is right.
func TestPullStartsAgainWhenTheServerWillNotContinue(t *testing.T) {
	content := devregistry.DiskContent(8<<20, 14)
	tap := &blobTap{all: true}
	ignoreRanges := atomic.Bool{}
	url := newQuietServer(t, tap.middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if ignoreRanges.Load() {
			r.Header.Del("Range")
		}
		http.ServeContent(w, r, "img.raw", time.Time{}, bytes.NewReader(content))
	})))
	src := Source{URI: url + "/img.raw", SHA256: shaHex(content), Size: int64(len(content))}
	p := fastPuller(nil)
	p.HTTP = http.DefaultClient
	dir := t.TempDir()
	interrupted(t, dir, p, src, tap, int64(len(content)/2))
	ignoreRanges.Store(true)
	firstSent := tap.sent.Load()

	store, res, _, _ := resumed(t, dir, p, src)
	assertStored(t, store, content)
	if res.Restarts != 1 || res.Kept != 0 || res.NetworkBytes != int64(len(content)) {
		t.Errorf("result %+v: want one restart from byte 0 and the whole file downloaded", res)
	}
	t.Logf("registry sent %d bytes after the restart (the refused 200 is cut short)", tap.sent.Load()-firstSent)
}

// TestPullDiscardsKeptBytesLongerThanTheDownload: a checkpoint that covers
// more bytes than the download has (it parses, it cannot be right) is not
// read nor continued: the pull starts from byte 0.
func TestPullDiscardsKeptBytesLongerThanTheDownload(t *testing.T) {
	content := devregistry.DiskContent(1<<20, 15)
	url := newQuietServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.ServeContent(w, r, "img.raw", time.Time{}, bytes.NewReader(content))
	}))
	src := Source{URI: url + "/img.raw", SHA256: shaHex(content), Size: int64(len(content))}
	store := openStore(t)
	w, err := store.Resume(src.SHA256)
	if err != nil {
		t.Fatal(err)
	}
	w.Write(content[:1000])
	if err := w.Checkpoint(sourceID(src, object{}), int64(len(content))+100, string(shaHex(content[:1000]))); err != nil {
		t.Fatal(err)
	}
	w.Suspend()
	if w, err = store.Resume(src.SHA256); err != nil {
		t.Fatal(err)
	}
	p := fastPuller(nil)
	p.HTTP = http.DefaultClient
	res, err := p.Pull(context.Background(), src, w, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Abort()
	if !strings.Contains(res.KeptDiscarded, "more than the 1048576 of the download") || res.Kept != 0 || res.NetworkBytes != int64(len(content)) {
		t.Errorf("result %+v: want the kept bytes discarded and the whole file downloaded", res)
	}
}

// TestPullCancelledWhileCheckingKeptBytes: a shutdown while the kept bytes
// are read back (before any network byte) ends the pull at once and keeps
// the checkpoint as it was: the next pull continues from it.
func TestPullCancelledWhileCheckingKeptBytes(t *testing.T) {
	content := devregistry.DiskContent(48<<20, 16)
	var sent atomic.Int64
	url := newQuietServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.ServeContent(countingWriter{w, &sent}, r, "img.raw", time.Time{}, bytes.NewReader(content))
	}))
	src := Source{URI: url + "/img.raw", SHA256: shaHex(content), Size: int64(len(content))}
	kept := int64(40 << 20)
	dir := t.TempDir()
	store, err := imagestore.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	w, _ := store.Resume(src.SHA256)
	w.Write(content[:kept])
	if err := w.Checkpoint(sourceID(src, object{}), kept, string(shaHex(content[:kept]))); err != nil {
		t.Fatal(err)
	}
	w.Suspend()
	w, _ = store.Resume(src.SHA256)
	p := fastPuller(nil)
	p.HTTP = http.DefaultClient
	ctx, cancel := context.WithCancel(context.Background())
	calls := 0
	_, err = p.Pull(ctx, src, w, func(int64, int64) {
		// The first report is the start; the second, a sign of life from
		// the check: stop there, as a SIGTERM would.
		if calls++; calls == 2 {
			cancel()
		}
	})
	if !errors.Is(err, context.Canceled) || sent.Load() != 0 {
		t.Fatalf("pull cancelled during the check: %v, %d bytes asked of the server", err, sent.Load())
	}
	w.Suspend()
	store.Close()

	_, res, _, _ := resumed(t, dir, p, src)
	if res.Kept != kept || sent.Load() != int64(len(content))-kept {
		t.Errorf("after the cancelled check: kept %d, server sent %d; want %d kept and the %d left", res.Kept, sent.Load(), kept, int64(len(content))-kept)
	}
}

// TestPullStartsAgainFromAPoisonedPartial: a kept gzip layer whose bytes
// match their checkpoint but were corrupted by the network before they were
// kept (so their checkpoint vouches for them) fails to decompress, at once
// (a broken deflate block) or at its end (a changed byte of data): the pull
// discards it and starts again from byte 0, and the image is stored once
// the registry sends the right bytes. On today's main such a partial failed
// every later pull, with "flate: corrupt input" for ever in the first case.
func TestPullStartsAgainFromAPoisonedPartial(t *testing.T) {
	for _, tc := range []struct {
		name string
		at   int
		// resumed says whether the network is asked for the rest of the
		// kept bytes before they are found wrong.
		resumed bool
	}{
		{"deflate block", 10, false},
		{"data", 1000, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tap := &blobTap{}
			reg := registryWith(t, tap.middleware)
			content := devregistry.DiskContent(16<<20, 17)
			src, pub := publish(t, reg, "dib/poisoned", content, true, nil)
			repo, err := reg.Repository("dib/poisoned")
			if err != nil {
				t.Fatal(err)
			}
			layer, err := readLayer(repo, pub)
			if err != nil {
				t.Fatal(err)
			}
			tap.digest = pub.LayerDigest.String()
			// What a faulty network left: the first half of the layer, one
			// byte early in it changed, checkpointed as received.
			cut := len(layer) / 2
			poisoned := bytes.Clone(layer[:cut])
			poisoned[tc.at] ^= 0x55
			dir := t.TempDir()
			store, err := imagestore.Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			w, err := store.Resume(src.SHA256)
			if err != nil {
				t.Fatal(err)
			}
			bw, err := w.BlobWriter(pub.LayerDigest.String(), int64(len(layer)))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := bw.Write(poisoned); err != nil {
				t.Fatal(err)
			}
			if err := w.Checkpoint(sourceID(src, object{digest: pub.LayerDigest}), int64(cut), string(shaHex(poisoned))); err != nil {
				t.Fatal(err)
			}
			w.Suspend()
			store.Close()

			p := fastPuller(ociClient(t, oci.Options{Insecure: true}))
			store, res, _, _ := resumed(t, dir, p, src)
			assertStored(t, store, content)
			t.Logf("discarded: %s", res.KeptDiscarded)
			if !strings.Contains(res.KeptDiscarded, "starts again from byte 0") || res.Kept != 0 || res.Restarts != 1 {
				t.Errorf("result %+v: want the kept partial discarded, one restart, nothing kept", res)
			}
			want := []string{""}
			if tc.resumed {
				want = []string{"bytes=" + strconv.Itoa(cut) + "-" + strconv.Itoa(len(layer)-1), ""}
			}
			if reqs := tap.requests(); strings.Join(reqs, ",") != strings.Join(want, ",") {
				t.Errorf("requests: %q, want %q", reqs, want)
			}
		})
	}
}

// TestPullKeepsNothingOfBytesThatDoNotDecompress: a registry that corrupts
// the first deflate block of a gzip layer, then stalls, and a shutdown
// during the stall (the sequence): the pull keeps nothing of what
// it received, and the next one, once the registry is right, stores the
// image from byte 0. On today's main the corrupted bytes were checkpointed
// where gunzip failed, and every later pull failed on them ("flate:
// corrupt input").
func TestPullKeepsNothingOfBytesThatDoNotDecompress(t *testing.T) {
	tap, faults := &blobTap{}, &devregistry.Faults{}
	reg := registryWith(t, func(next http.Handler) http.Handler { return tap.middleware(faults.Middleware(next)) })
	content := devregistry.DiskContent(16<<20, 18)
	src, pub := publish(t, reg, "dib/corrupt-then-stall", content, true, nil)
	tap.digest = pub.LayerDigest.String()
	faults.Set("dib/corrupt-then-stall", devregistry.Blobs, devregistry.Corrupt(10))
	p := fastPuller(ociClient(t, oci.Options{Insecure: true}))
	p.CheckpointInterval = 10 * time.Millisecond
	dir := t.TempDir()
	// The bytes received do not decompress: nothing of them is kept.
	interruptedKeeping(t, dir, p, src, tap, src.ArchiveSize/2, false)

	faults.Clear("dib/corrupt-then-stall")
	store, res, first, _ := resumed(t, dir, p, src)
	assertStored(t, store, content)
	if first != 0 || res.Kept != 0 || res.KeptDiscarded != "" {
		t.Errorf("the pull after the restart started at %d, kept %d bytes, discarded %q: want nothing of the corrupted ones kept", first, res.Kept, res.KeptDiscarded)
	}
}

// slowCheckpoints is a resumable writer whose checkpoints block while gate
// is held, as on a disk so busy that a small write and a rename wait: it
// records how far past the last checkpoint written the writes ever went.
type slowCheckpoints struct {
	*imagestore.Writer
	gate    chan struct{} // a checkpoint waits until it is closed
	mu      sync.Mutex
	written int64
	last    int64 // the last checkpoint written
	ahead   int64 // the most written past last, ever
	calls   int
	held    chan struct{} // closed when a checkpoint waits at the gate
}

func (s *slowCheckpoints) Write(p []byte) (int, error) {
	n, err := s.Writer.Write(p)
	s.mu.Lock()
	s.written += int64(n)
	s.ahead = max(s.ahead, s.written-s.last)
	s.mu.Unlock()
	return n, err
}

func (s *slowCheckpoints) Checkpoint(source string, offset int64, sum string) error {
	s.mu.Lock()
	s.calls++
	wait := s.calls == 2
	s.mu.Unlock()
	if wait {
		close(s.held)
		<-s.gate
	}
	if err := s.Writer.Checkpoint(source, offset, sum); err != nil {
		return err
	}
	s.mu.Lock()
	s.last = offset
	s.mu.Unlock()
	return nil
}

func (s *slowCheckpoints) Written() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.written
}

// TestPullWaitsForASlowCheckpoint: while a checkpoint takes long (a busy
// disk), the download writes at most aheadCheckpoints × CheckpointBytes
// past the last one, so that a SIGKILL never loses more than that of what
// was written; it goes on at once when the checkpoint is written.
func TestPullWaitsForASlowCheckpoint(t *testing.T) {
	reg := newRegistry(t, devregistry.Options{})
	content := devregistry.DiskContent(16<<20, 12)
	src, _ := publish(t, reg, "dib/slow-checkpoint", content, false, nil)
	p := fastPuller(ociClient(t, oci.Options{Insecure: true}))
	p.CheckpointBytes = 256 << 10
	bound := aheadCheckpoints * p.CheckpointBytes
	store := openStore(t)
	w, err := store.Resume(src.SHA256)
	if err != nil {
		t.Fatal(err)
	}
	dst := &slowCheckpoints{Writer: w, gate: make(chan struct{}), held: make(chan struct{})}
	done := make(chan error, 1)
	go func() {
		_, err := p.Pull(context.Background(), src, dst, nil)
		done <- err
	}()
	<-dst.held
	// The writes catch up with the bound, and stop there until the
	// checkpoint is written.
	testenv.Eventually(t, "the writes reach the bound", 30*time.Second, func() (bool, string) {
		dst.mu.Lock()
		defer dst.mu.Unlock()
		return dst.written-dst.last > bound-p.CheckpointBytes, fmt.Sprintf("written %d, last checkpoint %d", dst.written, dst.last)
	})
	close(dst.gate)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if dst.ahead > bound {
		t.Errorf("written %d bytes past the last checkpoint while it was slow, want at most %d", dst.ahead, bound)
	}
	if err := w.Commit(imagestore.Entry{Filename: "slow.raw"}); err != nil {
		t.Fatal(err)
	}
	assertStored(t, store, content)
}
