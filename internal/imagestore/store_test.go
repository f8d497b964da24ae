package imagestore

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sylva-projects/osimages/internal/devregistry"
	"github.com/sylva-projects/osimages/internal/osimage"
)

func shaOf(b []byte) osimage.SHA256 {
	s := sha256.Sum256(b)
	sha, err := osimage.ParseSHA256(hex.EncodeToString(s[:]))
	if err != nil {
		panic(err)
	}
	return sha
}

func openStore(t *testing.T, dir string) *Store {
	t.Helper()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// put writes content through a Writer in uneven pieces, as a pull would,
// and commits it.
func put(t *testing.T, s *Store, content []byte, filename string) Entry {
	t.Helper()
	w, err := s.Create(shaOf(content))
	if err != nil {
		t.Fatal(err)
	}
	for rest := content; len(rest) > 0; {
		n := min(len(rest), 100_000)
		if _, err := w.Write(rest[:n]); err != nil {
			t.Fatal(err)
		}
		rest = rest[n:]
	}
	if err := w.Commit(Entry{Filename: filename, MD5: "D41D8CD98F00B204E9800998ECF8427E"}); err != nil {
		t.Fatal(err)
	}
	e, ok := s.Get(shaOf(content))
	if !ok {
		t.Fatal("committed entry not listed")
	}
	return e
}

func readAll(t *testing.T, s *Store, sha osimage.SHA256) []byte {
	t.Helper()
	f, _, err := s.Open(sha)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b, err := io.ReadAll(f)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func entries(dir string) []string {
	des, _ := os.ReadDir(dir)
	var out []string
	for _, de := range des {
		out = append(out, de.Name())
	}
	return out
}

func TestCommitSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	// Mostly zeros, with data at odd offsets and trailing zeros, so that
	// holes, partial blocks and the final length are all exercised.
	content := devregistry.DiskContent(6<<20+12345, 7)
	content[5<<20+3] = 1
	e := put(t, s, content, "ubuntu.raw")
	if e.Size != int64(len(content)) || e.Filename != "ubuntu.raw" || e.MD5 != "d41d8cd98f00b204e9800998ecf8427e" || time.Since(e.VerifiedAt) > time.Minute {
		t.Fatalf("entry = %+v", e)
	}
	if !bytes.Equal(readAll(t, s, e.SHA256), content) {
		t.Fatal("stored content differs")
	}
	if s.Used() != int64(len(content)) {
		t.Fatalf("Used = %d, want %d", s.Used(), len(content))
	}
	if free, err := s.Available(); err != nil || free == 0 {
		t.Fatalf("Available = %d, %v", free, err)
	}

	// Zero blocks are holes: the file occupies about the random quarter.
	fi, err := os.Stat(filepath.Join(dir, "images", string(e.SHA256), "ubuntu.raw"))
	if err != nil {
		t.Fatal(err)
	}
	if used := fi.Sys().(*syscall.Stat_t).Blocks * 512; used > int64(len(content))/2 {
		t.Errorf("image file uses %d bytes of disk for %d bytes of mostly zeros: not sparse", used, len(content))
	}

	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2 := openStore(t, dir)
	got, ok := s2.Get(e.SHA256)
	if !ok || got.Size != e.Size || got.MD5 != e.MD5 || got.Filename != e.Filename || !got.VerifiedAt.Equal(e.VerifiedAt) {
		t.Fatalf("after restart: %+v, %v; want %+v", got, ok, e)
	}
	if l := s2.List(); len(l) != 1 || l[0].SHA256 != e.SHA256 {
		t.Fatalf("List after restart = %+v", l)
	}
	if !bytes.Equal(readAll(t, s2, e.SHA256), content) {
		t.Fatal("content differs after restart")
	}
}

func TestCrashLeavesNothingServable(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	good := put(t, s, []byte("committed image"), "good.raw")

	// A download cut by a crash: written, never committed nor aborted.
	partial := []byte("half an image")
	w, err := s.Create(shaOf(partial))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(partial); err != nil {
		t.Fatal(err)
	}
	s.Close()

	// What other crashes, or hands, may leave in images/.
	mk := func(name string, files map[string]string) string {
		d := filepath.Join(dir, "images", name)
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		for f, c := range files {
			if err := os.WriteFile(filepath.Join(d, f), []byte(c), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return d
	}
	sha := func(s string) string { return string(shaOf([]byte(s))) }
	noMeta := mk(sha("no metadata"), map[string]string{"x.raw": "no metadata"})
	badSize := mk(sha("bad size"), map[string]string{"x.raw": "bad size", MetadataName: `{"sha256":"` + sha("bad size") + `","filename":"x.raw","size":99}`})
	otherSHA := mk(sha("other sha"), map[string]string{"x.raw": "other sha", MetadataName: `{"sha256":"` + sha("x") + `","filename":"x.raw","size":9}`})
	badName := mk(sha("bad name"), map[string]string{"x.raw": "bad name", MetadataName: `{"sha256":"` + sha("bad name") + `","filename":"../x.raw","size":8}`})
	garbage := mk(sha("garbage"), map[string]string{MetadataName: "{not json"})
	symlinked := mk(sha("link"), map[string]string{MetadataName: `{"sha256":"` + sha("link") + `","filename":"x.raw","size":4}`})
	if err := os.Symlink("/etc/hostname", filepath.Join(symlinked, "x.raw")); err != nil {
		t.Fatal(err)
	}
	foreign := mk("lost+found", nil)
	// A staging directory complete up to its metadata: the rename never ran.
	mk(filepath.Join("..", "tmp", sha("staged")+"-123"), map[string]string{"x.raw": "staged", MetadataName: `{"sha256":"` + sha("staged") + `","filename":"x.raw","size":6}`})

	s2 := openStore(t, dir)
	if l := s2.List(); len(l) != 1 || l[0].SHA256 != good.SHA256 {
		t.Fatalf("after the crash List = %+v, want only %s", l, good.SHA256)
	}
	if left := entries(filepath.Join(dir, "tmp")); len(left) != 0 {
		t.Errorf("tmp/ still holds %v", left)
	}
	for _, d := range []string{noMeta, badSize, otherSHA, badName, garbage, symlinked} {
		if _, err := os.Lstat(d); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("invalid entry %s was not cleaned: %v", filepath.Base(d), err)
		}
	}
	// Metadata at fault beside a file that may be the verified image: set
	// aside, bytes kept. The image file at fault (the metadata is right),
	// or nothing but metadata: removed.
	for d, aside := range map[string]bool{noMeta: true, otherSHA: true, badName: true, badSize: false, garbage: false, symlinked: false} {
		kept, _ := filepath.Glob(filepath.Join(dir, setAsideDir, filepath.Base(d)+"-*", "x.raw"))
		if aside != (len(kept) == 1) {
			t.Errorf("entry %s: set aside %v, want %v", filepath.Base(d), kept, aside)
		}
	}
	if _, err := os.Stat(foreign); err != nil {
		t.Errorf("a directory the store did not make was removed: %v", err)
	}
	if _, _, err := s2.Open(shaOf(partial)); !errors.Is(err, ErrNotFound) {
		t.Errorf("Open of the crashed download = %v, want ErrNotFound", err)
	}
	// The same image downloads and commits again after the crash.
	put(t, s2, partial, "partial.raw")
}

func TestDeleteWhileReading(t *testing.T) {
	s := openStore(t, t.TempDir())
	content := devregistry.DiskContent(8<<20, 3)
	e := put(t, s, content, "img.raw")

	const readers = 8
	var files []*os.File
	for range readers {
		f, _, err := s.Open(e.SHA256)
		if err != nil {
			t.Fatal(err)
		}
		// Each client has started its download.
		if _, err := io.CopyN(io.Discard, f, 1<<20); err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}

	var wg sync.WaitGroup
	results := make(chan string, readers)
	for _, f := range files {
		wg.Go(func() {
			defer f.Close()
			h := sha256.New()
			h.Write(content[:1<<20])
			if _, err := io.Copy(h, f); err != nil {
				results <- err.Error()
				return
			}
			results <- hex.EncodeToString(h.Sum(nil))
		})
	}
	// Opens racing the delete either get the whole file or ErrNotFound.
	wg.Go(func() {
		for range 200 {
			f, _, err := s.Open(e.SHA256)
			if err != nil {
				if !errors.Is(err, ErrNotFound) {
					results <- "open: " + err.Error()
				}
				return
			}
			f.Close()
		}
	})
	if err := s.Delete(e.SHA256); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(results)
	for r := range results {
		if osimage.SHA256(r) != e.SHA256 {
			t.Errorf("a reader of the deleted image got %s", r)
		}
	}
	if _, ok := s.Get(e.SHA256); ok {
		t.Error("deleted entry still listed")
	}
	if _, _, err := s.Open(e.SHA256); !errors.Is(err, ErrNotFound) {
		t.Errorf("Open after Delete = %v, want ErrNotFound", err)
	}
	if err := s.Delete(e.SHA256); !errors.Is(err, ErrNotFound) {
		t.Errorf("second Delete = %v, want ErrNotFound", err)
	}
	if s.Used() != 0 {
		t.Errorf("Used = %d after Delete", s.Used())
	}
	if left := entries(filepath.Join(s.Dir(), "images")); len(left) != 0 {
		t.Errorf("images/ still holds %v", left)
	}
	if left := entries(filepath.Join(s.Dir(), "tmp")); len(left) != 0 {
		t.Errorf("tmp/ still holds %v", left)
	}
}

func TestInvalidNamesAreRefused(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	// Every sha256 given was parsed where it came in (osimage.SHA256);
	// the zero one would name the store's own directories.
	if _, err := s.Resume(shaOf([]byte("kept"))); err != nil {
		t.Fatal(err)
	}
	// A value converted by a bug, not parsed, never becomes a path.
	for _, bad := range []osimage.SHA256{"", "../../etc/passwd", "..", "images", osimage.SHA256(strings.Repeat("A", 64))} {
		if _, err := s.Create(bad); err == nil || !strings.Contains(err.Error(), "sha256") {
			t.Errorf("Create(%q) = %v, want an error about the sha256", bad, err)
		}
		if _, err := s.Resume(bad); err == nil || !strings.Contains(err.Error(), "sha256") {
			t.Errorf("Resume(%q) = %v, want an error about the sha256", bad, err)
		}
		if err := s.RemovePartial(bad); err == nil || !strings.Contains(err.Error(), "sha256") {
			t.Errorf("RemovePartial(%q) = %v, want an error about the sha256", bad, err)
		}
		if _, _, err := s.Open(bad); err == nil {
			t.Errorf("Open(%q) succeeded", bad)
		}
		if err := s.Delete(bad); err == nil {
			t.Errorf("Delete(%q) succeeded", bad)
		}
	}
	if ps, err := s.Partials(); err != nil || len(ps) != 1 {
		t.Errorf("the partial download kept is gone: %+v %v", ps, err)
	}
	content := []byte("some image")
	for _, name := range []string{"", ".", "..", "a/b", "/abs", "../up", "nul\x00byte", MetadataName, partialName, strings.Repeat("n", 256)} {
		w, err := s.Create(shaOf(content))
		if err != nil {
			t.Fatal(err)
		}
		w.Write(content)
		if err := w.Commit(Entry{Filename: name}); err == nil || !strings.Contains(err.Error(), "filename") {
			t.Errorf("Commit with filename %q = %v, want an error about the filename", name, err)
		}
		w.Abort()
	}
	if l := s.List(); len(l) != 0 {
		t.Fatalf("refused commits are listed: %+v", l)
	}
	if left := entries(filepath.Join(dir, "tmp")); len(left) != 0 {
		t.Errorf("aborted writers left %v in tmp/", left)
	}
	// A sha256 has one spelling (osimage.ParseSHA256): an uppercase one
	// names no entry.
	e := put(t, s, content, "ok.raw")
	if _, ok := s.Get(osimage.SHA256(strings.ToUpper(string(e.SHA256)))); ok {
		t.Error("Get with an uppercase sha256 found the entry")
	}
}

func TestWriterSemantics(t *testing.T) {
	s := openStore(t, t.TempDir())
	content := devregistry.DiskContent(1<<20, 1)
	sha := shaOf(content)

	// Reset discards a first attempt entirely, even a longer one.
	w, err := s.Create(sha)
	if err != nil {
		t.Fatal(err)
	}
	w.Write(bytes.Repeat([]byte{0xff}, 3<<20))
	if err := w.Reset(); err != nil {
		t.Fatal(err)
	}
	w.Write(content)
	if err := w.Commit(Entry{SHA256: sha, Size: int64(len(content)) + 1, Filename: "a.raw"}); err == nil || !strings.Contains(err.Error(), "written") {
		t.Errorf("Commit with a wrong size = %v", err)
	}
	if err := w.Commit(Entry{SHA256: shaOf([]byte("other")), Filename: "a.raw"}); err == nil {
		t.Error("Commit of another sha256 succeeded")
	}
	if err := w.Commit(Entry{Filename: "a.raw"}); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(readAll(t, s, sha), content) {
		t.Fatal("content after Reset differs")
	}
	if _, err := w.Write([]byte("x")); err == nil {
		t.Error("Write after Commit succeeded")
	}
	if err := w.Abort(); err != nil {
		t.Errorf("Abort after Commit = %v, want a no-op", err)
	}
	if _, ok := s.Get(sha); !ok {
		t.Error("Abort after Commit removed the entry")
	}

	// Two downloads of the same image: the second commit is a no-op.
	w2, _ := s.Create(sha)
	w2.Write(content)
	if err := w2.Commit(Entry{Filename: "b.raw"}); err != nil {
		t.Fatalf("second Commit = %v, want success", err)
	}
	if e, _ := s.Get(sha); e.Filename != "a.raw" {
		t.Errorf("second Commit replaced the entry: %+v", e)
	}
	if left := entries(filepath.Join(s.Dir(), "tmp")); len(left) != 0 {
		t.Errorf("tmp/ still holds %v", left)
	}
}

func TestOneStorePerDirectory(t *testing.T) {
	dir := t.TempDir()
	s := openStore(t, dir)
	if _, err := Open(dir); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Fatalf("second Open = %v, want an in-use error", err)
	}
	s.Close()
	openStore(t, dir)
}

func TestOpenRefusesUnusableDirectory(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	os.WriteFile(file, nil, 0o644)
	if _, err := Open(file); err == nil || !strings.Contains(err.Error(), file) {
		t.Fatalf("Open of a file = %v, want an error naming it", err)
	}
	if _, err := Open(""); err == nil {
		t.Fatal("Open(\"\") succeeded")
	}
}

func TestWriterLimit(t *testing.T) {
	s := openStore(t, t.TempDir())
	content := []byte("0123456789abcdef")
	w, err := s.Create(shaOf(content))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Abort()
	w.SetLimit(12)
	if _, err := w.Write(content[:10]); err != nil {
		t.Fatal(err)
	}
	n, err := w.Write(content[10:])
	if !errors.Is(err, ErrLimit) || n != 0 || w.Size() != 10 {
		t.Fatalf("write past the limit: %d, %v; size %d", n, err, w.Size())
	}
	if err := w.Commit(Entry{Filename: "x.raw"}); !errors.Is(err, ErrLimit) {
		t.Errorf("Commit after a refused write = %v, want ErrLimit", err)
	}
	// Reset starts over, under the same bound.
	w2, _ := s.Create(shaOf(content))
	w2.SetLimit(int64(len(content)))
	if _, err := w2.Write(content); err != nil {
		t.Fatal(err)
	}
	if err := w2.Commit(Entry{Filename: "x.raw"}); err != nil {
		t.Fatal(err)
	}
}

// logBuffer is a logger whose lines a test reads.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

func TestTamperedImagesAreDroppedLoudly(t *testing.T) {
	other := filepath.Join(t.TempDir(), "other")
	for _, tc := range []struct {
		name   string
		tamper func(t *testing.T, path string, content []byte)
		reason string
	}{
		{"symlink", func(t *testing.T, path string, content []byte) {
			// The same bytes elsewhere: only the kind of file tells.
			os.WriteFile(other, content, 0o644)
			os.Remove(path)
			if err := os.Symlink(other, path); err != nil {
				t.Fatal(err)
			}
		}, "symlink"},
		{"truncated", func(t *testing.T, path string, content []byte) {
			if err := os.Truncate(path, int64(len(content)/2)); err != nil {
				t.Fatal(err)
			}
		}, "not the"},
		{"directory", func(t *testing.T, path string, _ []byte) {
			os.Remove(path)
			if err := os.Mkdir(path, 0o755); err != nil {
				t.Fatal(err)
			}
		}, "not a regular file"},
	} {
		for _, when := range []string{"at start", "while serving"} {
			t.Run(tc.name+" "+when, func(t *testing.T) {
				dir := t.TempDir()
				logs := &logBuffer{}
				log := slog.New(slog.NewJSONHandler(logs, nil))
				s, err := Open(dir, WithLogger(log))
				if err != nil {
					t.Fatal(err)
				}
				content := devregistry.DiskContent(64<<10, 9)
				e := put(t, s, content, "img.raw")
				path := filepath.Join(dir, "images", string(e.SHA256), "img.raw")
				if when == "at start" {
					s.Close()
					tc.tamper(t, path, content)
					if s, err = Open(dir, WithLogger(log)); err != nil {
						t.Fatal(err)
					}
				} else {
					tc.tamper(t, path, content)
					f, _, err := s.Open(e.SHA256)
					if !errors.Is(err, ErrTampered) || f != nil || !strings.Contains(err.Error(), tc.reason) {
						t.Fatalf("Open = %v, want ErrTampered saying %q", err, tc.reason)
					}
				}
				defer s.Close()
				if _, ok := s.Get(e.SHA256); ok {
					t.Error("the tampered entry is still listed")
				}
				if _, err := os.Lstat(filepath.Dir(path)); !errors.Is(err, fs.ErrNotExist) {
					t.Errorf("the tampered entry is still on disk: %v", err)
				}
				line := grepLine(logs.String(), string(e.SHA256))
				if !strings.Contains(line, "stored image dropped") || !strings.Contains(line, tc.reason) || !strings.Contains(line, `"level":"WARN"`) {
					t.Errorf("log %q: want a warning naming the image and the reason %q", logs.String(), tc.reason)
				}
				// The same image commits again.
				put(t, s, content, "img.raw")
			})
		}
	}
}

func grepLine(s, sub string) string {
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			return l
		}
	}
	return ""
}
