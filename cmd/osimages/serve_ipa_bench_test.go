package main

import (
	"crypto/md5"
	"crypto/sha256"
	endian "encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/sylva-projects/osimages/internal/devregistry"
	"github.com/sylva-projects/osimages/internal/imagestore"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/testenv"
)

// ipaStreamed is IPA's own log line of a streamed image: its time, from
// before it connects to after the last byte is written, and its bytes.
var ipaStreamed = regexp.MustCompile(`Image streamed onto device \S+ in ([0-9.]+) seconds for ([0-9]+) bytes`)

// BenchmarkIPADownload: IPA's own download and write (prepare_image,
// streaming a raw image onto a file) of one large image from `osimages
// serve` and from Debian's nginx serving the same file (a hard link: the
// same inode, the same page cache), runs alternated, nginx first; the
// throughput is IPA's own figure (bytes over the seconds it logs). Run by
// `make bench-ipa` (hack/bench-ipa.sh); OSIMAGES_BENCH_IPA_SIZE (bytes,
// default 1 GiB) and OSIMAGES_BENCH_IPA_RUNS (default 3) change it.
func BenchmarkIPADownload(b *testing.B) {
	size := envInt(b, "OSIMAGES_BENCH_IPA_SIZE", 1<<30)
	runs := envInt(b, "OSIMAGES_BENCH_IPA_RUNS", 3)
	nginx, err := exec.LookPath("nginx")
	if err != nil {
		if nginx, err = exec.LookPath("/usr/sbin/nginx"); err != nil {
			testenv.Missing(b, "nginx is not installed (hack/bench-ipa.sh installs Debian's): no baseline")
		}
	}
	dir := b.TempDir()
	sum, md, name := storeBenchImage(b, filepath.Join(dir, "data"), size)
	www := filepath.Join(dir, "www", "images", string(sum))
	if err := os.MkdirAll(www, 0o755); err != nil {
		b.Fatal(err)
	}
	if err := os.Link(filepath.Join(dir, "data", "images", string(sum), name), filepath.Join(www, name)); err != nil {
		b.Fatal(err)
	}
	osImages := writeFile(b, "os-images.yaml", fmt.Sprintf("os_images:\n  bench:\n    uri: https://unused.invalid/%s\n    sha256: %s\n    md5: %s\n    filename: %s\n    size: %q\n",
		name, sum, md, name, strconv.FormatInt(size, 10)))
	values := writeFile(b, "mgmt.yaml", "name: mgmt\nos_image_server_additional_selectors:\n  all: {_os_images_key_: bench}\n")
	output := filepath.Join(dir, "served.yaml")
	ours := startServe(b, freeAddr(b), "--data", filepath.Join(dir, "data"), "--os-images", osImages, "-f", values, "--output-file", output, "--scrub-interval", "0")
	testenv.Eventually(b, "osimages serving the stored image", 60*time.Second, func() (bool, string) {
		return allAvailable(servedFile(output)(), sum), ours.stderr.String()
	})
	theirs := startNginx(b, nginx, filepath.Join(dir, "www"))
	path := osimage.ImagePath(sum, name)
	urls := map[string]string{"osimages": ours.url(path), "nginx": "http://" + theirs + path}
	mbps := map[string][]float64{}
	b.ResetTimer()
	for range b.N {
		for run := range runs {
			for _, server := range []string{"nginx", "osimages"} {
				r := testenv.IPA(b, testenv.IPARequest{Disk: ipaDisk(b), ImageInfo: testenv.RawImageInfo(urls[server], string(sum))})
				if r.Status != "SUCCEEDED" || !slices.Equal(r.Paths, []string{"stream"}) || !slices.Equal(r.Verified, []string{"sha256:" + string(sum)}) {
					b.Fatalf("IPA from %s: %s (%s: %s), paths %v, verified %v\n%s", server, r.Status, r.ErrorType, r.Error, r.Paths, r.Verified, r.Log)
				}
				m := ipaStreamed.FindStringSubmatch(r.Log)
				if m == nil || m[2] != strconv.FormatInt(size, 10) {
					b.Fatalf("IPA from %s logged no streamed image of %d bytes:\n%s", server, size, r.Log)
				}
				seconds, _ := strconv.ParseFloat(m[1], 64)
				mbps[server] = append(mbps[server], float64(size)/seconds/1e6)
				fmt.Printf("  run %d  %-8s  %7.1f MB/s  (%.2f s)\n", run+1, server, float64(size)/seconds/1e6, seconds)
			}
		}
	}
	b.StopTimer()
	ourMedian, theirMedian := median(mbps["osimages"]), median(mbps["nginx"])
	fmt.Printf("IPA stable/2025.1 streaming a %d MiB raw image onto a file, %d runs each (medians):\n", size>>20, len(mbps["nginx"]))
	fmt.Printf("  osimages  %7.1f MB/s\n  nginx     %7.1f MB/s\n  ratio osimages / nginx  %.3fx\n", ourMedian, theirMedian, ourMedian/theirMedian)
	b.ReportMetric(ourMedian, "osimages-MB/s")
	b.ReportMetric(theirMedian, "nginx-MB/s")
	b.ReportMetric(ourMedian/theirMedian, "ratio")
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}

func envInt(b *testing.B, name string, def int64) int64 {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n <= 0 {
		b.Fatalf("%s=%q: give a positive whole number", name, v)
	}
	return n
}

// storeBenchImage commits an image of size bytes (mbrDisk's pattern, a MiB
// at a time) into a new store at dataDir, as a download by the server
// would: written to a file while hashed, then copied into the store.
func storeBenchImage(b *testing.B, dataDir string, size int64) (osimage.SHA256, string, string) {
	const name = "bench-image.raw"
	tmp := filepath.Join(b.TempDir(), name)
	f, err := os.Create(tmp)
	if err != nil {
		b.Fatal(err)
	}
	sh, md := sha256.New(), md5.New()
	w := io.MultiWriter(f, sh, md)
	first := mbrDisk(1<<20, 11)
	// The partition spans the whole image, not the first MiB.
	endian.LittleEndian.PutUint32(first[446+12:], uint32(size/512-2048))
	if _, err := w.Write(first); err != nil {
		b.Fatal(err)
	}
	chunk := make([]byte, 1<<20)
	for off := int64(1 << 20); off < size; off += 1 << 20 {
		if off%(4<<20) == 0 {
			copy(chunk, devregistry.DiskContent(1<<20, uint64(off)))
		} else {
			clear(chunk)
		}
		if _, err := w.Write(chunk[:min(1<<20, size-off)]); err != nil {
			b.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		b.Fatal(err)
	}
	sum, err := osimage.ParseSHA256(hex.EncodeToString(sh.Sum(nil)))
	if err != nil {
		b.Fatal(err)
	}
	store, err := imagestore.Open(dataDir)
	if err != nil {
		b.Fatal(err)
	}
	defer store.Close()
	iw, err := store.Create(sum)
	if err != nil {
		b.Fatal(err)
	}
	defer iw.Abort()
	src, err := os.Open(tmp)
	if err != nil {
		b.Fatal(err)
	}
	defer src.Close()
	if _, err := io.Copy(iw, src); err != nil {
		b.Fatal(err)
	}
	mdHex := hex.EncodeToString(md.Sum(nil))
	if err := iw.Commit(imagestore.Entry{SHA256: sum, MD5: mdHex, Filename: name, Size: size, VerifiedAt: time.Now()}); err != nil {
		b.Fatal(err)
	}
	os.Remove(tmp)
	return sum, mdHex, name
}

// startNginx runs Debian's nginx on 127.0.0.1 over www, configured as Debian
// ships it for what touches sending a file (sendfile on, tcp_nopush on), and
// returns its address once it answers.
func startNginx(b *testing.B, binary, www string) string {
	root := b.TempDir()
	addr := freeAddr(b)
	user := ""
	if os.Geteuid() == 0 {
		user = "user root;\n" // the temporary folders are 0700
	}
	conf := fmt.Sprintf(`%sworker_processes 2;
daemon off;
pid %[2]s/nginx.pid;
error_log %[2]s/error.log warn;
events { worker_connections 768; }
http {
	sendfile on;
	tcp_nopush on;
	default_type application/octet-stream;
	access_log off;
	client_body_temp_path %[2]s/body;
	proxy_temp_path %[2]s/proxy;
	fastcgi_temp_path %[2]s/fastcgi;
	uwsgi_temp_path %[2]s/uwsgi;
	scgi_temp_path %[2]s/scgi;
	server { listen %[3]s; root %[4]s; }
}
`, user, root, addr, www)
	confPath := filepath.Join(root, "nginx.conf")
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(binary, "-p", root, "-c", confPath, "-e", filepath.Join(root, "error.log"))
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		cmd.Wait()
	})
	testenv.Eventually(b, "nginx answering", 30*time.Second, func() (bool, string) {
		code, body := get("http://" + addr + "/")
		return code != 0, body
	})
	return addr
}
