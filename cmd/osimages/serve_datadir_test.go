package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sylva-projects/osimages/internal/daemon"
	"github.com/sylva-projects/osimages/internal/devregistry"
	"github.com/sylva-projects/osimages/internal/imagestore"
	"github.com/sylva-projects/osimages/internal/testenv"
)

// stopWithin sends SIGTERM and fails the test unless the process exits,
// 0, within the shutdown grace (plus two seconds for the process itself).
func (d *serveProcess) stopWithin(t *testing.T) {
	t.Helper()
	began := time.Now()
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(daemon.ShutdownDeadline + 10*time.Second):
		d.cmd.Process.Kill()
		<-d.done
		t.Fatalf("still running %v after SIGTERM:\n%s", time.Since(began), d.stderr.String())
	}
	if took := time.Since(began); took > daemon.ShutdownGrace+2*time.Second {
		t.Errorf("exited %v after SIGTERM: more than the %v grace", took, daemon.ShutdownGrace)
	}
	if code := d.cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("exit code %d after SIGTERM, want 0:\n%s", code, d.stderr.String())
	}
}

// TestServeStartsWithSpecialFilesInTheDataDirectory: FIFOs planted in the
// data directory (as a stored image's metadata, as the checkpoint and the
// kept blob of a download) neither stop the server from listening nor from
// serving the other images, nor a SIGTERM from ending it: the image whose
// metadata is a FIFO is set aside (bytes kept) and downloaded again, the
// download is started again from byte 0, each with a warning naming the
// file. On today's main the server never listened, and ignored SIGTERM.
func TestServeStartsWithSpecialFilesInTheDataDirectory(t *testing.T) {
	reg := testenv.Registry(t, devregistry.Options{})
	published := publishHostile(t, reg, 2<<20, "a-untouched", "b-metadata", "c-partial")
	stored := map[string]devregistry.Published{"a-untouched": published["a-untouched"], "b-metadata": published["b-metadata"]}
	data, addr := t.TempDir(), freeAddr(t)
	args := func(images map[string]devregistry.Published) []string {
		return []string{"--data", data, "--os-images", writeFile(t, "os-images.yaml", osImagesDocFor(images)),
			"-f", writeFile(t, "mgmt.yaml", hostileMgmt), "--output-file", filepath.Join(t.TempDir(), "served.yaml")}
	}
	served := func(d *serveProcess, p devregistry.Published) (bool, string) {
		sum, code := sha256Of(t, d.url(imagePath(p)))
		return code == 200 && sum == p.Fields.Get("sha256"), d.statusPage() + d.stderr.String()
	}

	d := startServe(t, addr, args(stored)...)
	for key, p := range stored {
		testenv.Eventually(t, key+" served", 60*time.Second, func() (bool, string) { return served(d, p) })
	}
	d.stopWithin(t)

	sha := func(key string) string { return published[key].Fields.Get("sha256") }
	meta := filepath.Join(data, "images", sha("b-metadata"), ".osimages.json")
	partial := filepath.Join(data, "partial", sha("c-partial"))
	if err := os.Mkdir(partial, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, fifo := range []string{meta, filepath.Join(partial, ".checkpoint.json"), filepath.Join(partial, ".blob")} {
		os.Remove(fifo)
		if err := syscall.Mkfifo(fifo, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	d = startServe(t, addr, args(published)...)
	testenv.Eventually(t, "the server listening", 30*time.Second, func() (bool, string) {
		return d.statusPage() != "", d.stderr.String()
	})
	for _, key := range []string{"a-untouched", "b-metadata", "c-partial"} {
		testenv.Eventually(t, key+" served after the restart", 60*time.Second, func() (bool, string) { return served(d, published[key]) })
	}
	log := d.stderr.String()
	if n := strings.Count(log, `"msg":"download started"`); n != 2 {
		t.Errorf("%d downloads after the restart, want 2 (the untouched image is served as stored):\n%s", n, log)
	}
	if line := grepLines(log, "stored image set aside"); !strings.Contains(line, meta) || !strings.Contains(line, "a FIFO") {
		t.Errorf("want a warning that the image is set aside, naming %s as a FIFO:\n%s", meta, log)
	}
	if aside, _ := filepath.Glob(filepath.Join(data, "set-aside", sha("b-metadata")+"-*", published["b-metadata"].Fields.Get("filename"))); len(aside) != 1 {
		t.Errorf("the image set aside: %v, want its file kept", aside)
	}
	if line := grepLines(log, "partial download discarded"); !strings.Contains(line, partial) || !strings.Contains(line, "a FIFO") {
		t.Errorf("want a warning that the partial download is discarded, naming a FIFO in %s:\n%s", partial, log)
	}
	d.stopWithin(t)
}

// TestServeRecoversFromAPoisonedPartial: a kept download of a gzip layer
// whose bytes were corrupted by the network before they were kept (they
// match their checkpoint, and do not decompress) is discarded at the first
// attempt, and the image downloaded from byte 0 and served. On today's main
// every attempt failed with "flate: corrupt input" from the kept partial,
// and the image was never served again.
func TestServeRecoversFromAPoisonedPartial(t *testing.T) {
	reg := testenv.Registry(t, devregistry.Options{})
	published := publishHostile(t, reg, 8<<20, "poisoned")
	pub := published["poisoned"]
	resp, err := http.Get("http://" + reg.Host + "/v2/" + pub.Repository + "/blobs/" + pub.LayerDigest.String())
	if err != nil {
		t.Fatal(err)
	}
	layer, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("reading the layer: %d, %v", resp.StatusCode, err)
	}
	// What a faulty network left behind a shutdown: half the layer, its
	// first deflate block broken, checkpointed as received.
	data := t.TempDir()
	poisoned := bytes.Clone(layer[:len(layer)/2])
	poisoned[10] ^= 0x55
	store, err := imagestore.Open(data)
	if err != nil {
		t.Fatal(err)
	}
	w, err := store.Resume(imageSHA(t, pub))
	if err != nil {
		t.Fatal(err)
	}
	bw, err := w.BlobWriter(pub.LayerDigest.String(), int64(len(layer)))
	if err != nil {
		t.Fatal(err)
	}
	bw.Write(poisoned)
	sum := sha256.Sum256(poisoned)
	if err := w.Checkpoint("blob "+pub.LayerDigest.String(), int64(len(poisoned)), hex.EncodeToString(sum[:])); err != nil {
		t.Fatal(err)
	}
	w.Suspend()
	store.Close()

	d := startServe(t, freeAddr(t), "--data", data, "--os-images", writeFile(t, "os-images.yaml", osImagesDocFor(published)),
		"-f", writeFile(t, "mgmt.yaml", hostileMgmt), "--output-file", filepath.Join(t.TempDir(), "served.yaml"))
	testenv.Eventually(t, "the image served", 60*time.Second, func() (bool, string) {
		sum, code := sha256Of(t, d.url(imagePath(pub)))
		return code == 200 && sum == pub.Fields.Get("sha256"), d.statusPage() + d.stderr.String()
	})
	log := d.stderr.String()
	if line := grepLines(log, "partial download discarded"); !strings.Contains(line, "flate: corrupt input") || !strings.Contains(line, "from byte 0") {
		t.Errorf("want a warning that the partial download was discarded, saying why:\n%s", log)
	}
	if strings.Contains(log, "download failed") {
		t.Errorf("the discarded partial cost a failed attempt:\n%s", log)
	}
}
