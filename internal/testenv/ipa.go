package testenv

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// IPAPythonPathEnv names where hack/tools.sh unpacked the libraries that
// ironic-python-agent stable/2025.1 needs newer than Debian 12 has (Debian
// 13's oslo.utils, for its image format inspector, and the netaddr it
// imports): `hack/tools.sh env` sets it.
const IPAPythonPathEnv = "OSIMAGES_IPA_PYTHONPATH"

// ipaScript drives IPA's standby extension (see the file for what it
// stands in for: the block device, and nothing else).
//
//go:embed ipa.py
var ipaScript string

// IPAImageInfo is the image_info of IPA's prepare_image, as Ironic's
// conductor sends it for a whole-disk image in a direct deploy.
type IPAImageInfo struct {
	ID              string   `json:"id"`
	URLs            []string `json:"urls"`
	Checksum        string   `json:"checksum,omitempty"`
	OSHashAlgo      string   `json:"os_hash_algo,omitempty"`
	OSHashValue     string   `json:"os_hash_value,omitempty"`
	DiskFormat      string   `json:"disk_format"`
	StreamRawImages bool     `json:"stream_raw_images"`
	ImageType       string   `json:"image_type"`
}

// RawImageInfo is the image_info of a raw whole-disk image at url, checked
// against sha256 (Ironic passes the catalog's checksum as os_hash_value),
// streamed to the disk as Metal3 asks by default.
func RawImageInfo(url, sha256 string) IPAImageInfo {
	return IPAImageInfo{ID: "osimages-test", URLs: []string{url}, OSHashAlgo: "sha256", OSHashValue: sha256,
		DiskFormat: "raw", StreamRawImages: true, ImageType: "whole-disk"}
}

// IPARequest is one prepare_image.
type IPARequest struct {
	// Disk is the host's install device: a regular file, or a FIFO that
	// the test reads at its own pace.
	Disk      string       `json:"disk"`
	ImageInfo IPAImageInfo `json:"image_info"`
	// Conf overrides IPA's options (image_download_connection_retries,
	// image_download_connection_retry_interval, ...).
	Conf map[string]any `json:"conf,omitempty"`
	// HashDisk asks for the sha256 of Disk after the command.
	HashDisk bool `json:"hash_disk,omitempty"`
	// Result is where the driver writes what IPA did (set by StartIPA).
	Result string `json:"result"`
}

// IPAResult is what IPA did, as the driver observed it.
type IPAResult struct {
	// Status is the command's: SUCCEEDED or FAILED (REFUSED when its
	// validator refused the image_info).
	Status    string `json:"status"`
	ErrorType string `json:"error_type"`
	Error     string `json:"error"`
	// Paths are the write paths prepare_image took, in order: "stream"
	// (_stream_raw_image_onto_device) or "cache" (_cache_and_write_image).
	Paths []string `json:"paths"`
	// DownloadBytes are the bytes each download attempt that reached a
	// server received (IPA's ImageDownload.bytes_transferred), and
	// ContentLengths what the server announced for each.
	DownloadBytes  []int64   `json:"download_bytes"`
	ContentLengths []*string `json:"content_lengths"`
	// Verified are the checksums IPA's verify_image accepted ("sha256:<hex>").
	Verified   []string `json:"verified"`
	DiskSHA256 string   `json:"disk_sha256"`
	// Log is IPA's log (standard error).
	Log string `json:"-"`
}

// IPARun is a prepare_image under way.
type IPARun struct {
	cmd    *exec.Cmd
	result string
	stderr lockedBuffer
	done   chan struct{}
	err    error
}

// StartIPA runs ironic-python-agent's own prepare_image (the IPA
// stable/2025.1 of shared/metal3, on Debian's libraries and the newer ones
// hack/tools.sh unpacks) for req, in a Python process of its own. Where IPA
// or its libraries are absent it ends the test with Missing.
func StartIPA(t testing.TB, req IPARequest) *IPARun {
	t.Helper()
	pythonPath := ipaPythonPath(t)
	req.Result = filepath.Join(t.TempDir(), "result.json")
	in, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	r := &IPARun{done: make(chan struct{}), result: req.Result}
	r.cmd = exec.CommandContext(ctx, "/usr/bin/python3", "-c", ipaScript)
	r.cmd.Stdin = bytes.NewReader(in)
	r.cmd.Stdout, r.cmd.Stderr = &r.stderr, &r.stderr
	// requests would let these override IPA's own TLS settings.
	r.cmd.Env = []string{"PYTHONPATH=" + pythonPath}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "REQUESTS_CA_BUNDLE=") && !strings.HasPrefix(kv, "CURL_CA_BUNDLE=") && !strings.HasPrefix(kv, "PYTHONPATH=") {
			r.cmd.Env = append(r.cmd.Env, kv)
		}
	}
	if err := r.cmd.Start(); err != nil {
		cancel()
		t.Fatalf("starting IPA: %v", err)
	}
	go func() {
		r.err = r.cmd.Wait()
		cancel()
		close(r.done)
	}()
	t.Cleanup(func() {
		r.cmd.Process.Kill()
		<-r.done
	})
	return r
}

// Done is closed when IPA's process has ended.
func (r *IPARun) Done() <-chan struct{} { return r.done }

// Pid is the process id of IPA's process.
func (r *IPARun) Pid() int { return r.cmd.Process.Pid }

// Log is IPA's log so far.
func (r *IPARun) Log() string { return r.stderr.String() }

// Wait waits for the command's end and returns what IPA did. A crash of
// the driver (not a failure of the command, which is a result) fails the
// test.
func (r *IPARun) Wait(t testing.TB) IPAResult {
	t.Helper()
	<-r.done
	var got IPAResult
	out, err := os.ReadFile(r.result)
	if err == nil {
		err = json.Unmarshal(out, &got)
	}
	if r.err != nil || err != nil {
		t.Fatalf("IPA's driver: %v, its result: %v\nlog:\n%s", r.err, err, r.Log())
	}
	got.Log = r.Log()
	return got
}

// IPA runs req to its end.
func IPA(t testing.TB, req IPARequest) IPAResult {
	t.Helper()
	return StartIPA(t, req).Wait(t)
}

// ipaPythonPath unpacks IPA's source from shared/metal3 and returns the PYTHONPATH that puts the newer libraries first,
// then IPA.
func ipaPythonPath(t testing.TB) string {
	t.Helper()
	shared := os.Getenv("OSIMAGES_SHARED_DIR")
	if shared == "" {
		shared = findSharedDir()
	}
	if shared == "" {
		Missing(t, "shared/ fixtures not found beside the checkout (set OSIMAGES_SHARED_DIR): IPA is not run")
	}
	tgz := filepath.Join(shared, "metal3", "ironic-python-agent-stable-2025.1.tgz")
	if _, err := os.Stat(tgz); err != nil {
		Missing(t, "IPA's source %s is absent: IPA is not run", tgz)
	}
	libs := os.Getenv(IPAPythonPathEnv)
	if libs == "" {
		Missing(t, "%s is not set: run the tests through make test, or eval \"$(hack/tools.sh env)\" (it unpacks Debian 13's oslo.utils that IPA imports); IPA is not run", IPAPythonPathEnv)
	}
	if err := exec.Command("/usr/bin/python3", "-c", "import oslo_config, oslo_concurrency, oslo_log, requests, stevedore, tenacity, pint, pyudev, eventlet").Run(); err != nil {
		Missing(t, "the Debian 12 libraries IPA imports are not installed (python3-ironic, python3-pint, python3-pyudev; hack/tools.sh installs them as root): IPA is not run")
	}
	for _, tool := range []string{"parted", "hexdump"} {
		if _, err := exec.LookPath(tool); err != nil {
			if _, err := os.Stat("/usr/sbin/" + tool); err != nil {
				Missing(t, "%s is not installed (IPA checks the written disk with it; hack/tools.sh installs it as root): IPA is not run", tool)
			}
		}
	}
	// IPA from its source, as the recipe's ramdisk has it (no install:
	// the driver imports it from the tree).
	dir := t.TempDir()
	if out, err := exec.Command("tar", "-C", dir, "-xzf", tgz).CombinedOutput(); err != nil {
		t.Fatalf("unpacking %s: %v\n%s", tgz, err, out)
	}
	return libs + string(os.PathListSeparator) + filepath.Join(dir, "ironic-python-agent")
}

// lockedBuffer is a bytes.Buffer written by a process and read by a test
// while it runs.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
