package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sylva-projects/osimages/internal/daemon"
	"github.com/sylva-projects/osimages/internal/devregistry"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/testenv"
)

// hostileMgmt selects every image published by publishHostile.
const hostileMgmt = mgmtServeValues + `oci_registry_insecure: true
os_image_server_additional_selectors:
  all: {os: debian}
`

// publishHostile publishes images under dib/<key>, each with content of
// size bytes (gzipped), annotated so that hostileMgmt selects them.
func publishHostile(t *testing.T, reg *devregistry.Registry, size int, keys ...string) map[string]devregistry.Published {
	t.Helper()
	out := map[string]devregistry.Published{}
	for i, key := range keys {
		p, err := reg.Publish(context.Background(), devregistry.DiskImage{
			Repository: "dib/" + key, Tag: "1.0", Gzip: true,
			Content: devregistry.DiskContent(size, uint64(100+i)),
			Fields:  osimage.Image{"os": "debian"},
		})
		if err != nil {
			t.Fatal(err)
		}
		out[key] = p
	}
	return out
}

// statusPage is the server's status page, "" while it does not answer.
func (d *serveProcess) statusPage() string {
	resp, err := http.Get(d.url("/"))
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return string(body)
}

func imagePath(p devregistry.Published) string {
	return "/images/" + p.Fields.Get("sha256") + "/" + p.Fields.Get("filename")
}

// TestServeStopsPromptlyOnSignal: SIGTERM or SIGINT while a download is
// held mid-stream by the registry, and a client is in the middle of an
// image, ends the process within the shutdown grace, exit 0, with the
// download neither retried nor counted as failed and its partial file
// kept, checkpointed, for the next start. On today's main the worker looped on the cancelled download:
// megabytes of log, and no exit until SIGKILL.
func TestServeStopsPromptlyOnSignal(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run(sig.String(), func(t *testing.T) {
			faults := &devregistry.Faults{}
			reg := testenv.Registry(t, devregistry.Options{Middleware: faults.Middleware})
			published := publishHostile(t, reg, 24<<20, "held", "ready")
			faults.Set("dib/held", devregistry.Blobs, devregistry.StallAfter(1<<20))
			data := t.TempDir()
			d := startServe(t, freeAddr(t), "--data", data, "--os-images", writeFile(t, "os-images.yaml", osImagesDocFor(published)),
				"-f", writeFile(t, "mgmt.yaml", hostileMgmt), "--output-file", filepath.Join(t.TempDir(), "served.yaml"))
			held := published["held"].Fields.Get("sha256")
			// Held once bytes of it are written: a signal before its first
			// byte (the manifest still on its way, on a busy machine) would
			// leave nothing to checkpoint.
			testenv.Eventually(t, "one image ready, the other held mid-download", 60*time.Second, func() (bool, string) {
				staged, _ := os.ReadDir(filepath.Join(data, "partial"))
				partial, err := os.Stat(filepath.Join(data, "partial", held, ".partial"))
				page := d.statusPage()
				return downloadingOnPage(page) && strings.Contains(page, ">ready<") && len(staged) == 1 && err == nil && partial.Size() > 0, page + d.stderr.String()
			})
			// A client in the middle of the ready image, reading nothing.
			conn, err := net.Dial("tcp", d.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", imagePath(published["ready"]))
			if _, err := http.ReadResponse(bufio.NewReader(conn), nil); err != nil {
				t.Fatal(err)
			}

			began := time.Now()
			d.cmd.Process.Signal(sig)
			select {
			case <-d.done:
			case <-time.After(daemon.ShutdownGrace + 5*time.Second):
				d.cmd.Process.Kill()
				<-d.done
				t.Fatalf("still running %v after %s; log of %d bytes, %d \"download started\" lines", time.Since(began), sig, d.stderr.Len(), strings.Count(d.stderr.String(), "download started"))
			}
			took := time.Since(began)
			t.Logf("exited %v after %s", took, sig)
			if took > daemon.ShutdownGrace+2*time.Second {
				t.Errorf("exited %v after %s: more than the %v grace given to HTTP responses in flight", took, sig, daemon.ShutdownGrace)
			}
			if code := d.cmd.ProcessState.ExitCode(); code != 0 {
				t.Errorf("exit code %d after %s, want 0:\n%s", code, sig, d.stderr.String())
			}
			log := d.stderr.String()
			if n := strings.Count(log, `"msg":"download started"`); n != 2 {
				t.Errorf("%d downloads started, want 2 (one per image, none again after the signal):\n%s", n, log)
			}
			if strings.Contains(log, "download failed") || !strings.Contains(log, "interrupted by shutdown") {
				t.Errorf("the interrupted download must be logged as such, not as a failure:\n%s", log)
			}
			if staged, _ := os.ReadDir(filepath.Join(data, "tmp")); len(staged) != 0 {
				t.Errorf("files left in tmp/: %v", staged)
			}
			if _, err := os.Stat(filepath.Join(data, "partial", held, ".checkpoint.json")); err != nil {
				t.Errorf("the interrupted download is not kept, checkpointed, for the next start: %v", err)
			}
		})
	}
}

// TestServeHostileRegistriesNeverStarveTheQueue: with --concurrency 2, an
// image whose registry stalls and one it trickles at a byte per 20 ms
// never keep a good image queued: it is served within seconds.
func TestServeHostileRegistriesNeverStarveTheQueue(t *testing.T) {
	faults := &devregistry.Faults{}
	reg := testenv.Registry(t, devregistry.Options{Middleware: faults.Middleware})
	published := publishHostile(t, reg, 2<<20, "a-stall", "b-trickle", "c-good")
	faults.Set("dib/a-stall", devregistry.Blobs, devregistry.StallAfterHeaders())
	faults.Set("dib/b-trickle", devregistry.Blobs, devregistry.Trickle(1, 20*time.Millisecond))
	d := startServe(t, freeAddr(t), "--data", t.TempDir(), "--os-images", writeFile(t, "os-images.yaml", osImagesDocFor(published)),
		"-f", writeFile(t, "mgmt.yaml", hostileMgmt), "--output-file", filepath.Join(t.TempDir(), "served.yaml"),
		"--concurrency", "2", "--stall-timeout", "2s", "--min-rate", "64Ki")
	began := time.Now()
	good := published["c-good"]
	testenv.Eventually(t, "the good image served", 30*time.Second, func() (bool, string) {
		sum, code := sha256Of(t, d.url(imagePath(good)))
		return code == 200 && sum == good.Fields.Get("sha256"), d.statusPage()
	})
	t.Logf("good image served %v after the start, behind a stalled and a trickled one", time.Since(began))
	testenv.Eventually(t, "the stall reported", 30*time.Second, func() (bool, string) {
		page := d.statusPage()
		return strings.Contains(page, "stalled: no byte received for 2s (--stall-timeout)"), page
	})
}

// TestServeBoundsAGzipBombOnASmallDisk: a gzip bomb with no size declared
// is cut at --max-image-size on a 48 MiB data volume, and the image
// downloading beside it is served (on today's main the bomb filled the
// volume and the good download failed with ENOSPC). --free-space-margin 0
// means no margin: with the default 1Gi nothing would fit this volume.
func TestServeBoundsAGzipBombOnASmallDisk(t *testing.T) {
	data := testenv.SmallFS(t, 48<<20)
	faults := &devregistry.Faults{}
	reg := testenv.Registry(t, devregistry.Options{Middleware: faults.Middleware})
	published := publishHostile(t, reg, 8<<20, "b-good")
	bomb, err := reg.Publish(context.Background(), devregistry.DiskImage{
		Repository: "dib/a-bomb", Tag: "1.0", Gzip: true, Layer: devregistry.GzipBomb(1 << 30),
		Fields: osimage.Image{"os": "debian"},
	})
	if err != nil {
		t.Fatal(err)
	}
	delete(bomb.Fields, "size")
	published["a-bomb"] = bomb
	faults.Set("dib/b-good", devregistry.Blobs, devregistry.Trickle(64<<10, 20*time.Millisecond))
	d := startServe(t, freeAddr(t), "--data", data, "--os-images", writeFile(t, "os-images.yaml", osImagesDocFor(published)),
		"-f", writeFile(t, "mgmt.yaml", hostileMgmt), "--output-file", filepath.Join(t.TempDir(), "served.yaml"),
		"--concurrency", "2", "--free-space-margin", "0", "--max-image-size", "16Mi")
	good := published["b-good"]
	testenv.Eventually(t, "the good image served", 60*time.Second, func() (bool, string) {
		sum, code := sha256Of(t, d.url(imagePath(good)))
		return code == 200 && sum == good.Fields.Get("sha256"), d.statusPage() + d.stderr.String()
	})
	testenv.Eventually(t, "the bomb refused", 30*time.Second, func() (bool, string) {
		page := d.statusPage()
		return strings.Contains(page, "bounded by --max-image-size or, when less, by the space that was free (16.0 MiB)"), page
	})
}

func TestServeRefusesBadFlagValues(t *testing.T) {
	base := []string{"serve", "--data", t.TempDir(), "-f", "x.yaml", "--os-images", "y"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--max-storage", "-1Gi"}, `--max-storage "-1Gi": give a positive quantity`},
		{[]string{"--max-storage", "0"}, `--max-storage "0": give a positive quantity`},
		{[]string{"--gc-grace", "-1s"}, "--gc-grace -1s is negative"},
		{[]string{"--concurrency", "0"}, "--concurrency 0: at least one download"},
		{[]string{"--concurrency", "-2"}, "--concurrency -2: at least one download"},
		{[]string{"--poll", "-1s"}, "--poll -1s: the input files must be checked at a positive interval"},
		{[]string{"--poll", "0s"}, "--poll 0s"},
		{[]string{"--free-space-margin", "-1Mi"}, `--free-space-margin "-1Mi" is negative`},
		{[]string{"--stall-timeout", "0s"}, "--stall-timeout 0s: give a positive duration"},
		{[]string{"--min-rate", "-1"}, `--min-rate "-1" is negative`},
		{[]string{"--min-rate", "fast"}, `--min-rate "fast"`},
		{[]string{"--max-image-size", "0"}, `--max-image-size "0": give a positive quantity`},
		{[]string{"--max-image-size", "lots"}, `--max-image-size "lots"`},
		{[]string{"--scrub-interval", "-1h"}, "--scrub-interval -1h0m0s is negative: give 0 to switch the scrub off"},
		// A scrub of nanoseconds re-read small images in a loop, a log line
		// each time.
		{[]string{"--scrub-interval", "1ns"}, "--scrub-interval 1ns is below the minimum of 1m0s"},
		{[]string{"--scrub-interval", "59s"}, "--scrub-interval 59s is below the minimum of 1m0s"},
		{[]string{"--fleet-needs-configmap", "ns/Not_A_Name"}, `--fleet-needs-configmap "ns/Not_A_Name": want NAMESPACE/NAME: name "Not_A_Name"`},
		{[]string{"--output-configmap", "bad"}, `--output-configmap "bad": want NAMESPACE/NAME`},
		{[]string{"--peer-timeout", "-1s"}, "--peer-timeout -1s is negative"},
		{[]string{"--client-hold", "-1s"}, "--client-hold -1s is negative"},
		{[]string{"--peers-service", "peers", "--output-configmap", "ns/served", "--replicas", "-1"}, "--replicas -1 is negative"},
		{[]string{"--peers-service", "peers", "--output-configmap", "ns/served", "--claim-wait", "0s"}, "--claim-wait 0s: give a positive duration"},
		{[]string{"--scrub-rate", "0"}, `--scrub-rate "0": give a positive quantity`},
		{[]string{"--scrub-rate", "quick"}, `--scrub-rate "quick"`},
	} {
		r := run(t, append(base, tc.args...)...)
		if r.code != 2 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%v: exit %d, %q; want exit 2 saying %q", tc.args, r.code, r.stderr, tc.want)
		}
	}
	// Several at once are all reported.
	r := run(t, append(base, "--concurrency", "0", "--gc-grace", "-1m")...)
	if r.code != 2 || !strings.Contains(r.stderr, "--concurrency") || !strings.Contains(r.stderr, "--gc-grace") {
		t.Errorf("two bad flags: exit %d, %q", r.code, r.stderr)
	}
}
