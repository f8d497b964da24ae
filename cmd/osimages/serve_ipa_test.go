package main

import (
	"context"
	endian "encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sylva-projects/osimages/internal/devregistry"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/testenv"
)

// The tests of this file run ironic-python-agent's own download and write
// code (testenv.StartIPA: the standby extension's prepare_image, as Ironic
// calls it in Metal3's direct deploy) against `osimages serve`.
//
// The failure cases set IPA's image_download_connection_retries to 2 and
// its image_download_connection_retry_interval to 0 (IPA's defaults: 9 and
// 10 s), so that they take three attempts without waiting.
var ipaFastFailures = map[string]any{"image_download_connection_retries": 2, "image_download_connection_retry_interval": 0}

// ipaEnv is a server holding one raw disk image (an MBR with one partition,
// so that IPA's check of the written partition table passes), published in
// a registry as a gzip layer.
type ipaEnv struct {
	d      *serveProcess
	data   string
	sum    osimage.SHA256
	size   int64
	name   string
	output string
	// gate, when set, holds the registry's blob downloads until closed.
	gate chan struct{}
}

// imageURL is the image URL a Metal3MachineTemplate names.
func (e *ipaEnv) imageURL() string {
	return e.d.url(osimage.ImagePath(e.sum, e.name))
}

// blobURL is the OCI blob that Ironic resolves an oci:// URL to, and that
// its agent downloads, checked against the layer digest.
func (e *ipaEnv) blobURL() string {
	return e.d.url("/v2/" + osimage.OCIRepository(e.sum) + "/blobs/" + osimage.OCILayerDigest(e.sum).String())
}

// mbrDisk is DiskContent with a DOS partition table of one Linux
// partition from 1 MiB to the end.
func mbrDisk(size int, seed uint64) []byte {
	b := devregistry.DiskContent(size, seed)
	clear(b[440:512])
	entry := b[446:462]
	entry[4] = 0x83
	endian.LittleEndian.PutUint32(entry[8:], 2048)
	endian.LittleEndian.PutUint32(entry[12:], uint32(size/512-2048))
	b[510], b[511] = 0x55, 0xaa
	return b
}

// startIPAEnv publishes a size-byte image and starts a server that selects
// it. With gated, the registry holds the layer's download until e.gate is
// closed, and the server is not waited for.
func startIPAEnv(t *testing.T, size int, gated bool, args ...string) *ipaEnv {
	t.Helper()
	e := &ipaEnv{}
	var opts devregistry.Options
	if gated {
		e.gate = make(chan struct{})
		opts.Middleware = func(next http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/blobs/") {
					select {
					case <-e.gate:
					case <-r.Context().Done():
						return
					}
				}
				next.ServeHTTP(w, r)
			})
		}
	}
	reg := testenv.Registry(t, opts)
	p, err := reg.Publish(context.Background(), devregistry.DiskImage{
		Repository: "dib/ubuntu-plain", Tag: "1.0", Gzip: true, Content: mbrDisk(size, 11),
		Fields: osimage.Image{"os": "ubuntu", "hardened": "false", "k8s-flavor": "rke2", "k8s-version": "1.32.5+rke2r1"},
	})
	if err != nil {
		t.Fatal(err)
	}
	e.sum, e.size, e.name = imageSHA(t, p), int64(size), p.Fields.Get(osimage.FieldFilename)
	osImages := writeFile(t, "os-images.yaml", osImagesDocFor(map[string]devregistry.Published{"ubuntu-plain": p}))
	mgmt := writeFile(t, "mgmt.yaml", mgmtServeValues+"oci_registry_insecure: true\n")
	e.output = filepath.Join(t.TempDir(), "served.yaml")
	e.data = t.TempDir()
	e.d = startServe(t, freeAddr(t), append([]string{"--data", e.data, "--os-images", osImages, "-f", mgmt, "--output-file", e.output}, args...)...)
	if !gated {
		e.waitAvailable(t)
	}
	return e
}

func (e *ipaEnv) waitAvailable(t *testing.T) {
	t.Helper()
	testenv.Eventually(t, "image available", 120*time.Second, func() (bool, string) {
		return allAvailable(servedFile(e.output)(), e.sum), e.d.stderr.String()
	})
}

// checkWritten checks that IPA streamed the whole image onto the disk
// and verified it: one download, the image's bytes, its sha256.
func checkWritten(t *testing.T, r testenv.IPAResult, sum osimage.SHA256, size int64) {
	t.Helper()
	if r.Status != "SUCCEEDED" || !slices.Equal(r.Paths, []string{"stream"}) || !slices.Equal(r.DownloadBytes, []int64{size}) ||
		!slices.Equal(r.Verified, []string{"sha256:" + string(sum)}) || r.DiskSHA256 != string(sum) {
		t.Fatalf("IPA: status %s (%s: %s), paths %v, downloads %v bytes, verified %v, disk sha256 %s; want SUCCEEDED, streamed once, %d bytes, sha256 %s\n%s",
			r.Status, r.ErrorType, r.Error, r.Paths, r.DownloadBytes, r.Verified, r.DiskSHA256, size, sum, r.Log)
	}
}

func ipaDisk(t testing.TB) string {
	t.Helper()
	disk := filepath.Join(t.TempDir(), "sda")
	if err := os.WriteFile(disk, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	return disk
}

// IPA streams a raw image from both kinds of URL osimages gives: the image
// URL, checked against the sha256 Ironic passes as os_hash_value or against
// the URL's checksum file, and the OCI blob that an oci:// URL resolves to,
// checked against the layer digest.
func TestServeIPAStreamsTheImage(t *testing.T) {
	e := startIPAEnv(t, 24<<20, false)
	byFile := testenv.RawImageInfo(e.imageURL(), "")
	byFile.OSHashAlgo, byFile.OSHashValue, byFile.Checksum = "", "", e.imageURL()+".sha256sum"
	for _, c := range []struct {
		name string
		info testenv.IPAImageInfo
	}{
		{"image URL, sha256", testenv.RawImageInfo(e.imageURL(), string(e.sum))},
		{"image URL, checksum file", byFile},
		{"OCI blob, layer digest", testenv.RawImageInfo(e.blobURL(), osimage.OCILayerDigest(e.sum).Encoded())},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := testenv.IPA(t, testenv.IPARequest{Disk: ipaDisk(t), ImageInfo: c.info, HashDisk: true})
			checkWritten(t, r, e.sum, e.size)
		})
	}
}

// A wrong checksum, and a byte flipped in the stored image behind the
// server's back (same size, so the server's open does not see it): IPA's
// checksum refuses the bytes on every attempt, downloads the whole image
// each time (retries + 1 downloads), and fails; nothing is accepted.
func TestServeIPARefusesWrongBytes(t *testing.T) {
	e := startIPAEnv(t, 24<<20, false)
	wrong := strings.Repeat("0", 64)
	check := func(t *testing.T, r testenv.IPAResult) {
		t.Helper()
		want := []int64{e.size, e.size, e.size}
		if r.Status != "FAILED" || r.ErrorType != "ImageChecksumError" || len(r.Verified) != 0 || !slices.Equal(r.DownloadBytes, want) ||
			!slices.Equal(r.Paths, []string{"stream"}) {
			t.Fatalf("IPA: status %s (%s: %s), paths %v, downloads %v bytes, verified %v; want FAILED with ImageChecksumError after downloads %v, nothing verified\n%s",
				r.Status, r.ErrorType, r.Error, r.Paths, r.DownloadBytes, r.Verified, want, r.Log)
		}
	}
	t.Run("wrong checksum", func(t *testing.T) {
		r := testenv.IPA(t, testenv.IPARequest{Disk: ipaDisk(t), ImageInfo: testenv.RawImageInfo(e.imageURL(), wrong), Conf: ipaFastFailures})
		check(t, r)
		if !strings.Contains(r.Error, wrong) || !strings.Contains(r.Error, string(e.sum)) {
			t.Errorf("IPA's error does not name the expected and the actual checksum: %s", r.Error)
		}
	})
	t.Run("flipped byte", func(t *testing.T) {
		path := filepath.Join(e.data, "images", string(e.sum), e.name)
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		var b [1]byte
		if _, err := f.ReadAt(b[:], 12345); err != nil {
			t.Fatal(err)
		}
		b[0] ^= 0x01
		if _, err := f.WriteAt(b[:], 12345); err != nil {
			t.Fatal(err)
		}
		f.Close()
		for _, url := range []string{e.imageURL(), e.blobURL()} {
			r := testenv.IPA(t, testenv.IPARequest{Disk: ipaDisk(t), ImageInfo: testenv.RawImageInfo(url, string(e.sum)), Conf: ipaFastFailures})
			check(t, r)
		}
	})
}

// The server is killed (SIGKILL) while IPA streams the image, and stays
// down: IPA never verifies or reports the partial image. Its checksum
// refuses the cut stream (urllib3 1.x ends a short body quietly), its next
// attempt finds no server, and after its connection retries it fails with
// requests' connection error, which names the URL (IPA does not wrap it in
// its ImageDownloadError, nor try a further download). IPA reaches the
// server through a proxy that stops forwarding after 8 MiB, so that the kill
// lands at a known point of the image; the proxy then forwards what the
// server had sent before it died and the end of the connection, and refuses
// connections from then on, as the dead server's port does.
func TestServeIPAServerKilledMidDownload(t *testing.T) {
	e := startIPAEnv(t, 40<<20, false)
	const before = 8 << 20
	proxy := startPauseProxy(t, e.d.addr, before)
	url := "http://" + proxy.addr + osimage.ImagePath(e.sum, e.name)
	run := testenv.StartIPA(t, testenv.IPARequest{Disk: ipaDisk(t), ImageInfo: testenv.RawImageInfo(url, string(e.sum)), Conf: ipaFastFailures, HashDisk: true})
	select {
	case <-proxy.paused:
	case <-run.Done():
		t.Fatalf("IPA ended before the server sent it %d bytes:\n%s", before, run.Log())
	}
	e.d.kill(syscall.SIGKILL)
	close(proxy.resume)
	r := run.Wait(t)
	if r.Status != "FAILED" || len(r.Verified) != 0 || len(r.DownloadBytes) != 1 || r.DownloadBytes[0] >= e.size || r.DiskSHA256 == string(e.sum) ||
		!strings.Contains(r.Log, "Error verifying image checksum") || !strings.Contains(r.Error, "ECONNREFUSED") {
		t.Fatalf("IPA after the server's kill: status %s (%s: %s), downloads %v bytes, verified %v, disk sha256 %s; want FAILED, one download cut short and refused by the checksum, then connections refused, nothing verified\n%s",
			r.Status, r.ErrorType, r.Error, r.DownloadBytes, r.Verified, r.DiskSHA256, r.Log)
	}
	if !strings.Contains(r.Error, osimage.ImagePath(e.sum, e.name)) {
		t.Errorf("IPA's error does not name the URL: %s", r.Error)
	}
	t.Logf("IPA received %v bytes of %d, then failed: %s", r.DownloadBytes, e.size, r.Error)
}

// pauseProxy forwards TCP connections to a target and, once it has
// forwarded limit bytes from the target on one, stops reading from the
// target (closing paused) until resume is closed.
type pauseProxy struct {
	addr           string
	paused, resume chan struct{}
}

func startPauseProxy(t *testing.T, target string, limit int64) *pauseProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &pauseProxy{addr: ln.Addr().String(), paused: make(chan struct{}), resume: make(chan struct{})}
	t.Cleanup(func() { ln.Close() })
	var once sync.Once
	go func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer client.Close()
				server, err := net.Dial("tcp", target)
				if err != nil {
					return
				}
				defer server.Close()
				go io.Copy(server, client)
				n, _ := io.CopyN(client, server, limit)
				if n == limit {
					once.Do(func() { close(p.paused) })
					<-p.resume
					ln.Close()
				}
				io.Copy(client, server)
			}()
		}
	}()
	return p
}

// A client during a fill: IPA asks for the image while the server is still
// downloading it from the registry. The image URL and the OCI blob alike
// hold the request (--client-hold) until the image is verified, and IPA
// streams it in one download, without a retry (a 503 would cost it 10 s
// between tries, 10 tries in all).
func TestServeIPADuringAFill(t *testing.T) {
	for _, kind := range []string{"image URL", "OCI blob"} {
		t.Run(kind, func(t *testing.T) {
			e := startIPAEnv(t, 24<<20, true, "--client-hold", "45s")
			testenv.Eventually(t, "the server's fill started", 60*time.Second, func() (bool, string) {
				code, page := get(e.d.url("/"))
				return code == 200 && downloadingOnPage(page), page
			})
			url, hash := e.imageURL(), string(e.sum)
			if kind == "OCI blob" {
				url, hash = e.blobURL(), osimage.OCILayerDigest(e.sum).Encoded()
			}
			run := testenv.StartIPA(t, testenv.IPARequest{Disk: ipaDisk(t), ImageInfo: testenv.RawImageInfo(url, hash), HashDisk: true,
				Conf: map[string]any{"image_download_connection_retries": 60, "image_download_connection_retry_interval": 1}})
			port, _ := strconv.Atoi(e.d.addr[strings.LastIndex(e.d.addr, ":")+1:])
			// Released once IPA's request is held (its connection is open)
			// or was answered 503: the fill then ends while IPA waits.
			testenv.Eventually(t, "IPA's request held or answered 503", 120*time.Second, func() (bool, string) {
				return connectedTo(run.Pid(), port) || strings.Contains(run.Log(), "Received status code 503"), run.Log()
			})
			close(e.gate)
			r := run.Wait(t)
			checkWritten(t, r, e.sum, e.size)
			if strings.Contains(r.Log, "Received status code 503") {
				t.Errorf("IPA was answered 503 although the server holds a request for 45s:\n%s", r.Log)
			}
		})
	}
}

// connectedTo says whether process pid has an established TCP connection to
// port on 127.0.0.1 (its sockets, found in /proc).
func connectedTo(pid, port int) bool {
	inodes := map[string]bool{}
	fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	for _, fd := range fds {
		link, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
		if err == nil && strings.HasPrefix(link, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(link, "socket:["), "]")] = true
		}
	}
	table, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/tcp", pid))
	if err != nil {
		return false
	}
	want := fmt.Sprintf("0100007F:%04X", port)
	for _, line := range strings.Split(string(table), "\n")[1:] {
		f := strings.Fields(line)
		// remote address, state (01: established), inode
		if len(f) > 9 && f[2] == want && f[3] == "01" && inodes[f[9]] {
			return true
		}
	}
	return false
}
