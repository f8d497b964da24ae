// Command serve compares, in one run on one machine, the aggregate throughput
// of eight concurrent full downloads of the same 1 GiB image from
// `osimages serve` (through its image URL, and through the OCI blob that
// oci:// clients download) and from Debian's nginx (sendfile on, tcp_nopush on, two
// workers) serving the same file from a folder (shared/docs/benchmarks.md,
// "Serve"). It also samples the resident memory of the osimages server during
// its downloads.
//
// With -scrub-rate, the osimages server scrubs without pause during its
// runs (at that rate): a second image is stored beside the served one, so
// that the scrub reads a file the clients do not, and the figures show what
// the scrub costs serving. Both are stored as verified an hour ago, so the
// scrub starts at once; it runs at the shortest interval serve accepts
// (imageserver.MinScrubInterval), and the second image is large enough that a
// pass over both outlasts it (up to maxScrubbed: beyond, the scrub pauses,
// and the bench says so).
//
// Fairness: both servers serve the same inode (the nginx folder holds a hard
// link to the file in the image store), on 127.0.0.1, to the same curl
// command; the file is read once through each server before timing, so both
// serve from the page cache; the runs alternate, nginx first, and the median
// of each server is reported.
//
// It needs curl and nginx on PATH, and a built osimages (hack/bench-serve.sh
// installs and builds them).
package main

import (
	"bufio"
	"cmp"
	"context"
	"crypto/md5"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"hash"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/sylva-projects/osimages/bench/internal/proc"
	"github.com/sylva-projects/osimages/internal/imagestore"
	"github.com/sylva-projects/osimages/internal/osimage"
	imageserver "github.com/sylva-projects/osimages/internal/server"
)

const (
	mib      = 1 << 20
	gib      = 1 << 30
	imageKey = "bench-image"
	filename = "bench-image.raw"
	// scrubKey and scrubFilename are the second image, scrubbed and not
	// downloaded (-scrub-rate).
	scrubKey      = "bench-scrubbed"
	scrubFilename = "bench-scrubbed.raw"
	// maxScrubbed bounds the second image of -scrub-rate.
	maxScrubbed = 8 * gib
	// sampleEvery is how often the servers' memory is read during a run.
	sampleEvery = 50 * time.Millisecond
	// rssTarget and ratioTarget are the targets of the issue.
	rssTarget   = 64 * mib
	ratioTarget = 1.0
	// ociTolerance is how far the OCI blob's throughput may be from the
	// image URL's (issue 27).
	ociTolerance = 0.05
)

type options struct {
	size       int64
	clients    int
	runs       int
	binary     string
	nginx      string
	curl       string
	dir        string
	runTimeout time.Duration
	nice       int
	hold       time.Duration
	scrubRate  string
}

func main() {
	var o options
	flag.Int64Var(&o.size, "size", gib, "image size in bytes (a multiple of 1 MiB)")
	flag.IntVar(&o.clients, "clients", 8, "concurrent downloads in a run")
	flag.IntVar(&o.runs, "runs", 5, "runs of each server, alternated; the median is reported (odd is best)")
	flag.StringVar(&o.binary, "osimages", "bin/osimages", "osimages binary")
	flag.StringVar(&o.nginx, "nginx", "nginx", "nginx binary")
	flag.StringVar(&o.curl, "curl", "curl", "curl binary")
	flag.StringVar(&o.dir, "dir", "", "where to make the temporary folder (default $TMPDIR); the image needs size/4 of disk")
	flag.DurationVar(&o.runTimeout, "run-timeout", 5*time.Minute, "bound on one run of concurrent downloads")
	flag.IntVar(&o.nice, "nice", -10, "niceness of the scheduling autogroup of the benchmark, its servers and clients, so that other work on the machine disturbs the runs less (needs root, and this process to lead its own session, as hack/bench-serve.sh runs it; 0 leaves it)")
	flag.DurationVar(&o.hold, "hold", 0, "keep both servers up this long before the runs, printing their URLs, to attach strace or perf")
	flag.StringVar(&o.scrubRate, "scrub-rate", "", "run the osimages server with a scrub going on without pause at this rate (a quantity of bytes per second, such as 50Mi, the default of serve), over a second stored image and the served one; empty: no scrub")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, o)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench-serve:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, o options) error {
	if o.size <= 0 || o.size%mib != 0 || o.clients < 1 || o.runs < 1 {
		return errors.New("-size must be a positive multiple of 1 MiB, -clients and -runs at least 1")
	}
	for _, tool := range []*string{&o.binary, &o.nginx, &o.curl} {
		p, err := exec.LookPath(*tool)
		if err != nil {
			return fmt.Errorf("%s not found: run hack/bench-serve.sh, which installs nginx and builds osimages", *tool)
		}
		if *tool, err = filepath.Abs(p); err != nil {
			return err
		}
	}
	dir, err := os.MkdirTemp(o.dir, "bench-serve-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	fmt.Printf("serve benchmark: %d concurrent curl downloads of the same %s image on 127.0.0.1, %d runs of each server alternated, median reported\n",
		o.clients, human(o.size), o.runs)
	fmt.Printf("  scheduling: %s\n", raiseAutogroup(o.nice))
	start := time.Now()
	img, err := storeImage(filepath.Join(dir, "data"), o.size, filename, 42)
	if err != nil {
		return err
	}
	fmt.Printf("  image stored through imagestore in %.1f s: sha256 %s\n", time.Since(start).Seconds(), img.sha256)
	var scrubbed *image
	if o.scrubRate != "" {
		q, err := resource.ParseQuantity(o.scrubRate)
		if err != nil || q.Value() <= 0 {
			return fmt.Errorf("-scrub-rate %q: want a positive quantity of bytes per second, such as 50Mi", o.scrubRate)
		}
		// A pass over both images lasts the interval and a bit more.
		pass := q.Value() * int64((imageserver.MinScrubInterval + 5*time.Second).Seconds())
		size := min(max(o.size, (pass-o.size+mib-1)/mib*mib), maxScrubbed)
		other, err := storeImage(filepath.Join(dir, "data"), size, scrubFilename, 7)
		if err != nil {
			return err
		}
		scrubbed = &other
		fmt.Printf("  scrub: the osimages server scrubs at %s/s, every %s, over a second stored image of %s (sha256 %s) and the served one\n",
			o.scrubRate, imageserver.MinScrubInterval, human(size), other.sha256)
		if size+o.size < pass {
			fmt.Printf("  scrub: a pass over %s at %s/s lasts less than %s: the scrub pauses between passes\n", human(size+o.size), o.scrubRate, imageserver.MinScrubInterval)
		}
	}
	urlPath := osimage.ImagePath(img.sha256, filename)

	// The nginx folder holds a hard link to the stored file: the same inode,
	// so the same bytes from the same page cache for both servers.
	www := filepath.Join(dir, "www")
	linkDir := filepath.Join(www, "images", img.sha256.String())
	if err := os.MkdirAll(linkDir, 0o755); err != nil {
		return err
	}
	if err := os.Link(img.path, filepath.Join(linkDir, filename)); err != nil {
		return fmt.Errorf("linking the stored image into the nginx folder: %w", err)
	}

	ours, err := startOsimages(o.binary, dir, img, scrubbed, o.scrubRate)
	if err != nil {
		return err
	}
	defer ours.stop()
	theirs, err := startNginx(o.nginx, dir, www)
	if err != nil {
		return err
	}
	defer theirs.stop()
	ours.path, theirs.path = urlPath, urlPath
	// The same osimages process, through its OCI distribution API: the
	// blob oci:// clients download is the same stored file.
	oci := &server{name: "osimages oci", addr: ours.addr, logPath: ours.logPath, Process: ours.Process,
		path: "/v2/" + osimage.OCIRepository(img.sha256) + "/blobs/" + osimage.OCILayerDigest(img.sha256).String()}
	servers := []*server{theirs, ours, oci}
	for _, s := range servers {
		if err := s.waitReady(ctx, s.path, time.Minute); err != nil {
			return err
		}
	}
	// One checked download from each: a server that sends the wrong bytes
	// cannot pass for a fast one, and both then serve from the page cache.
	for _, s := range servers {
		sum, err := downloadSHA256(ctx, s.url(s.path))
		if err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
		if sum != img.sha256.String() {
			return fmt.Errorf("%s served content of sha256 %s, want %s", s.name, sum, img.sha256)
		}
	}
	fmt.Printf("  both servers checked (sha256 of a full download matches); osimages pid %d, nginx master pid %d\n\n", ours.pid(), theirs.pid())

	if o.hold > 0 {
		fmt.Printf("  holding for %s: osimages %s (pid %d), nginx %s (master pid %d, workers %v)\n",
			o.hold, ours.url(urlPath), ours.pid(), theirs.url(urlPath), theirs.pid(), procs(theirs.pid())[1:])
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(o.hold):
		}
	}

	// With a scrub, the osimages server is stopped (SIGSTOP) during the
	// nginx runs: its scrub then weighs on its own runs only, and the ratio
	// shows what it costs.
	var scrubRead float64
	results := map[*server][]result{}
	fmt.Printf("  %-3s %-12s %8s %8s %12s %10s %11s %14s\n", "run", "server", "wall s", "GiB/s", "server CPU s", "curl CPU s", "other CPU s", "server RSS max")
	for i := range o.runs {
		for _, s := range servers {
			if o.scrubRate != "" && s == theirs {
				syscall.Kill(ours.pid(), syscall.SIGSTOP)
			}
			var before float64
			if s != theirs {
				before = scrubReadBytes(ours)
			}
			r, err := downloadRun(ctx, o, s, s.path)
			if o.scrubRate != "" && s == theirs {
				syscall.Kill(ours.pid(), syscall.SIGCONT)
			}
			if s != theirs {
				scrubRead += scrubReadBytes(ours) - before
			}
			if ctx.Err() != nil {
				return errors.New("interrupted; servers stopped and temporary files removed")
			}
			if err != nil {
				return fmt.Errorf("%s, run %d: %w", s.name, i+1, err)
			}
			results[s] = append(results[s], r)
			fmt.Printf("  %-3d %-12s %8.3f %8.3f %12.2f %10.2f %11.2f %10.1f MiB\n", i+1, s.name, r.wall.Seconds(), r.gibps,
				r.serverCPU.Seconds(), r.clientCPU.Seconds(), r.otherCPU.Seconds(), float64(r.rssMax)/mib)
		}
	}
	if o.scrubRate != "" {
		var during float64
		for _, r := range slices.Concat(results[ours], results[oci]) {
			during += r.wall.Seconds()
		}
		fmt.Printf("\n  scrub: %.0f MiB re-hashed during the osimages runs (%.1f s): %.1f MiB/s; osimages was stopped during the nginx runs\n",
			scrubRead/mib, during, scrubRead/mib/during)
	}
	hwm, err := readStatus(ours.pid(), "VmHWM")
	if err != nil {
		return fmt.Errorf("osimages: %w", err)
	}

	med := func(s *server) result {
		rs := slices.Clone(results[s])
		slices.SortFunc(rs, func(a, b result) int { return cmp.Compare(a.wall, b.wall) })
		return rs[len(rs)/2]
	}
	mo, mn, mc := med(ours), med(theirs), med(oci)
	var rssMax int64
	for _, r := range results[ours] {
		rssMax = max(rssMax, r.rssMax)
	}
	ratio := mo.gibps / mn.gibps
	// CPU per GiB depends less than throughput on what else the machine
	// does: the servers and clients share its cores.
	costOf := func(s *server) float64 {
		costs := make([]float64, 0, len(results[s]))
		for _, r := range results[s] {
			costs = append(costs, (r.serverCPU+r.clientCPU).Seconds()/(float64(o.size)*float64(o.clients)/gib))
		}
		slices.Sort(costs)
		return costs[len(costs)/2]
	}
	fmt.Println()
	fmt.Printf("  nginx (sendfile, tcp_nopush, 2 workers)  %7.3f GiB/s aggregate (median)   server CPU %.2f s/run, server+curl CPU %.3f s/GiB\n",
		mn.gibps, mn.serverCPU.Seconds(), costOf(theirs))
	fmt.Printf("  osimages serve                           %7.3f GiB/s aggregate (median)   server CPU %.2f s/run, server+curl CPU %.3f s/GiB\n",
		mo.gibps, mo.serverCPU.Seconds(), costOf(ours))
	fmt.Printf("  osimages serve, oci:// blob              %7.3f GiB/s aggregate (median)   server CPU %.2f s/run, server+curl CPU %.3f s/GiB\n",
		mc.gibps, mc.serverCPU.Seconds(), costOf(oci))
	fmt.Printf("  ratio osimages / nginx                   %7.3fx   (target >= %.1fx: %s)\n", ratio, ratioTarget, verdict(ratio >= ratioTarget))
	ociRatio := mc.gibps / mo.gibps
	fmt.Printf("  ratio oci:// blob / image URL            %7.3fx   (target within %.0f%%: %s)\n", ociRatio, ociTolerance*100, verdict(ociRatio >= 1-ociTolerance && ociRatio <= 1+ociTolerance))
	fmt.Printf("  osimages RSS during the downloads        %7.1f MiB max of VmRSS every %s   (target < %d MiB: %s)\n",
		float64(rssMax)/mib, sampleEvery, rssTarget/mib, verdict(rssMax < rssTarget))
	fmt.Printf("  osimages VmHWM (peak since its start)    %7.1f MiB\n", float64(hwm)/mib)
	return nil
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "NOT met"
}

func human(n int64) string {
	if n%gib == 0 {
		return fmt.Sprintf("%d GiB", n/gib)
	}
	return fmt.Sprintf("%d MiB", n/mib)
}

// image is the benchmark image, committed in an image store.
type image struct {
	dataDir, path, md5 string
	sha256             osimage.SHA256
	size               int64
}

// content writes the image to w: 1 MiB chunks, one in four random and the
// rest zeros, compressible like a disk image (the pattern of
// devregistry.DiskContent, streamed since 1 GiB need not be in memory).
func content(w io.Writer, size int64, seed uint64) error {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	random, zeros := make([]byte, mib), make([]byte, mib)
	for i := int64(0); i*mib < size; i++ {
		chunk := zeros
		if i%4 == 0 {
			for j := 0; j < mib; j += 8 {
				v := rng.Uint64()
				for k := range 8 {
					random[j+k] = byte(v >> (8 * k))
				}
			}
			chunk = random
		}
		if _, err := w.Write(chunk); err != nil {
			return err
		}
	}
	return nil
}

// storeImage commits the image into a new image store at dataDir, as a
// download by the server would. The content is made twice, since the store
// needs the sha256 before the first byte: once to hash, once to write.
func storeImage(dataDir string, size int64, filename string, seed uint64) (image, error) {
	sha, md := sha256.New(), md5.New()
	if err := content(parallelHash{sha, md}, size, seed); err != nil {
		return image{}, err
	}
	sum, err := osimage.ParseSHA256(hex.EncodeToString(sha.Sum(nil)))
	if err != nil {
		return image{}, err
	}
	img := image{dataDir: dataDir, sha256: sum, md5: hex.EncodeToString(md.Sum(nil)), size: size}
	store, err := imagestore.Open(dataDir)
	if err != nil {
		return image{}, err
	}
	// The server takes the data directory's lock: release it first.
	defer store.Close()
	w, err := store.Create(img.sha256)
	if err != nil {
		return image{}, err
	}
	defer w.Abort()
	if err := content(w, size, seed); err != nil {
		return image{}, err
	}
	// Verified an hour ago: a scrub of the bench starts at once.
	verified := time.Now().Add(-time.Hour)
	if err := w.Commit(imagestore.Entry{SHA256: img.sha256, MD5: img.md5, Filename: filename, Size: size, VerifiedAt: verified}); err != nil {
		return image{}, err
	}
	img.path = filepath.Join(dataDir, "images", img.sha256.String(), filename)
	if fi, err := os.Stat(img.path); err != nil || fi.Size() != size {
		return image{}, fmt.Errorf("the committed image is not at %s with %d bytes: %v", img.path, size, err)
	}
	return img, nil
}

// parallelHash feeds two hashes at once, one per core.
type parallelHash [2]hash.Hash

func (p parallelHash) Write(b []byte) (int, error) {
	var wg sync.WaitGroup
	wg.Go(func() { p[1].Write(b) })
	p[0].Write(b)
	wg.Wait()
	return len(b), nil
}

// server is a server process started by the benchmark, in a process group of
// its own so that it and its workers can be ended together.
type server struct {
	name, addr, logPath string
	// path is what its clients download.
	path string
	*proc.Process
}

func (s *server) pid() int               { return s.Pid() }
func (s *server) url(path string) string { return "http://" + s.addr + path }

func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

func startServer(name, logPath string, argv []string) (*server, error) {
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logFile.Close()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	p, err := proc.Start(cmd)
	if err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	return &server{name: name, logPath: logPath, Process: p}, nil
}

// stop ends the server: SIGTERM, then SIGKILL of its process group after
// 10 s. nginx's master ends its workers on SIGTERM.
func (s *server) stop() { s.Stop(10 * time.Second) }

func (s *server) logTail() string {
	data, _ := os.ReadFile(s.logPath)
	if len(data) > 4000 {
		data = data[len(data)-4000:]
	}
	return string(data)
}

// waitReady waits until the image answers 200 to HEAD.
func (s *server) waitReady(ctx context.Context, urlPath string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	client := &http.Client{Timeout: 5 * time.Second}
	last := "no answer"
	for time.Now().Before(deadline) {
		select {
		case <-s.Done():
			return fmt.Errorf("%s exited before serving the image:\n%s", s.name, s.logTail())
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodHead, s.url(urlPath), nil)
		resp, err := client.Do(req)
		if err != nil {
			last = err.Error()
			continue
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			return nil
		}
		last = resp.Status
	}
	return fmt.Errorf("%s did not serve %s within %s (last: %s):\n%s", s.name, urlPath, timeout, last, s.logTail())
}

func startOsimages(binary, dir string, img image, scrubbed *image, scrubRate string) (*server, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	osImages := filepath.Join(dir, "os-images.yaml")
	entry := func(key, name string, img image) string {
		return fmt.Sprintf("  %s:\n    uri: https://unused.invalid/%s\n    sha256: %s\n    md5: %s\n    filename: %s\n    size: %q\n",
			key, name, img.sha256, img.md5, name, strconv.FormatInt(img.size, 10))
	}
	doc := "os_images:\n" + entry(imageKey, filename, img)
	values := filepath.Join(dir, "mgmt-values.yaml")
	vals := fmt.Sprintf("name: mgmt\nos_image_server_additional_selectors:\n  all: {_os_images_key_: %s}\n", imageKey)
	scrub := []string{"--scrub-interval", "0"}
	if scrubbed != nil {
		// Both selected, so that neither is collected during the runs.
		doc += entry(scrubKey, scrubFilename, *scrubbed)
		vals += fmt.Sprintf("  scrubbed: {_os_images_key_: %s}\n", scrubKey)
		scrub = []string{"--scrub-interval", imageserver.MinScrubInterval.String(), "--scrub-rate", scrubRate}
	}
	for path, data := range map[string]string{osImages: doc, values: vals} {
		if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
			return nil, err
		}
	}
	s, err := startServer("osimages", filepath.Join(dir, "osimages.log"), append([]string{
		binary, "serve", "--data", img.dataDir, "--listen", addr, "--os-images", osImages, "-f", values,
		"--output-file", filepath.Join(dir, "served.yaml"),
	}, scrub...))
	if err != nil {
		return nil, err
	}
	s.addr = addr
	return s, nil
}

func startNginx(binary, dir, www string) (*server, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	root := filepath.Join(dir, "nginx")
	if err := os.MkdirAll(filepath.Join(root, "tmp"), 0o755); err != nil {
		return nil, err
	}
	user := ""
	if os.Geteuid() == 0 {
		// The temporary folders are 0700: workers must run as their owner.
		user = "user root;\n"
	}
	// Debian's nginx.conf as it ships, for what touches serving a file:
	// sendfile on, tcp_nopush on; with two workers and everything on disk
	// kept in the temporary folder.
	conf := fmt.Sprintf(`%sworker_processes 2;
daemon off;
pid %[2]s/nginx.pid;
error_log %[2]s/error.log warn;
events { worker_connections 768; }
http {
	sendfile on;
	tcp_nopush on;
	types_hash_max_size 2048;
	default_type application/octet-stream;
	access_log %[2]s/access.log;
	client_body_temp_path %[2]s/tmp/body;
	proxy_temp_path %[2]s/tmp/proxy;
	fastcgi_temp_path %[2]s/tmp/fastcgi;
	uwsgi_temp_path %[2]s/tmp/uwsgi;
	scgi_temp_path %[2]s/tmp/scgi;
	server {
		listen %[3]s;
		root %[4]s;
		autoindex off;
	}
}
`, user, root, addr, www)
	confPath := filepath.Join(root, "nginx.conf")
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
		return nil, err
	}
	s, err := startServer("nginx", filepath.Join(root, "stderr.log"), []string{
		binary, "-p", root, "-c", confPath, "-e", filepath.Join(root, "error.log"),
	})
	if err != nil {
		return nil, err
	}
	s.addr = addr
	return s, nil
}

func downloadSHA256(ctx context.Context, url string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	h := sha256.New()
	if _, err := io.Copy(h, resp.Body); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// result is one run of concurrent downloads from one server.
type result struct {
	wall                 time.Duration
	gibps                float64
	serverCPU, clientCPU time.Duration
	// otherCPU is what the rest of the machine used during the run: other
	// work disturbs the figures.
	otherCPU time.Duration
	rssMax   int64
}

// downloadRun starts the clients together, each `curl -o /dev/null` of the
// whole image, and times them until the last one ends, while sampling the
// resident memory of the server (the sum over its processes).
func downloadRun(ctx context.Context, o options, s *server, urlPath string) (result, error) {
	ctx, cancel := context.WithTimeout(ctx, o.runTimeout)
	defer cancel()
	// The processes are listed once, so that sampling costs little CPU.
	pids := procs(s.pid())
	cpuBefore, err := groupCPU(pids)
	if err != nil {
		return result{}, err
	}
	busyBefore, err := machineBusy()
	if err != nil {
		return result{}, err
	}
	stopSampling := make(chan struct{})
	sampled := make(chan int64, 1)
	go func() {
		var peak int64
		t := time.NewTicker(sampleEvery)
		defer t.Stop()
		for {
			if rss, err := groupRSS(pids); err == nil {
				peak = max(peak, rss)
			}
			select {
			case <-stopSampling:
				sampled <- peak
				return
			case <-t.C:
			}
		}
	}()

	cmds := make([]*exec.Cmd, o.clients)
	outs := make([]strings.Builder, o.clients)
	for i := range cmds {
		cmds[i] = exec.CommandContext(ctx, o.curl, "-sS", "--max-time", strconv.Itoa(int(o.runTimeout.Seconds())),
			"-o", "/dev/null", "-w", "%{http_code} %{size_download}", s.url(urlPath))
		cmds[i].Stdout, cmds[i].Stderr = &outs[i], &outs[i]
	}
	start := time.Now()
	var startErr error
	for _, c := range cmds {
		if startErr = c.Start(); startErr != nil {
			break
		}
	}
	var errs []error
	for i, c := range cmds {
		if c.Process == nil {
			continue
		}
		if err := c.Wait(); err != nil {
			errs = append(errs, fmt.Errorf("curl %d: %w: %s", i, err, outs[i].String()))
		}
	}
	wall := time.Since(start)
	close(stopSampling)
	rssMax := <-sampled
	cpuAfter, cpuErr := groupCPU(pids)
	busyAfter, busyErr := machineBusy()
	if err := errors.Join(append(errs, startErr, cpuErr, busyErr)...); err != nil {
		return result{}, err
	}
	var clientCPU time.Duration
	want := fmt.Sprintf("200 %d", o.size)
	for i, c := range cmds {
		if got := strings.TrimSpace(outs[i].String()); got != want {
			return result{}, fmt.Errorf("curl %d: got %q (status, bytes), want %q", i, got, want)
		}
		clientCPU += c.ProcessState.UserTime() + c.ProcessState.SystemTime()
	}
	return result{
		wall:      wall,
		gibps:     float64(o.size) * float64(o.clients) / gib / wall.Seconds(),
		serverCPU: cpuAfter - cpuBefore,
		clientCPU: clientCPU,
		otherCPU:  max(0, busyAfter-busyBefore-(cpuAfter-cpuBefore)-clientCPU),
		rssMax:    rssMax,
	}, nil
}

// procs is pid and its children (nginx's workers).
func procs(pid int) []int {
	out := []int{pid}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil || child == pid {
			continue
		}
		if ppid, err := readStatus(child, "PPid"); err == nil && int(ppid) == pid {
			out = append(out, child)
		}
	}
	return out
}

// readStatus reads a field of /proc/PID/status: memory fields in bytes,
// others as the number given.
func readStatus(pid int, field string) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok || name != field {
			continue
		}
		parts := strings.Fields(rest)
		if len(parts) == 0 {
			break
		}
		n, err := strconv.ParseInt(parts[0], 10, 64)
		if err != nil {
			return 0, err
		}
		if len(parts) > 1 && parts[1] == "kB" {
			n *= 1024
		}
		return n, nil
	}
	return 0, fmt.Errorf("/proc/%d/status has no %s", pid, field)
}

func groupRSS(pids []int) (int64, error) {
	var total int64
	for _, p := range pids {
		rss, err := readStatus(p, "VmRSS")
		if err != nil {
			return 0, err
		}
		total += rss
	}
	return total, nil
}

// groupCPU is the user and system time of pids, from /proc/PID/stat
// (fields 14 and 15, in clock ticks of 1/100 s on Linux).
func groupCPU(pids []int) (time.Duration, error) {
	var total time.Duration
	for _, p := range pids {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p))
		if err != nil {
			return 0, err
		}
		// The command name, in parentheses, may hold spaces: count from
		// after it, where field 3 (state) is the first.
		i := strings.LastIndexByte(string(data), ')')
		fields := strings.Fields(string(data[i+1:]))
		if len(fields) < 13 {
			return 0, fmt.Errorf("/proc/%d/stat: too few fields", p)
		}
		for _, f := range fields[11:13] {
			ticks, err := strconv.ParseInt(f, 10, 64)
			if err != nil {
				return 0, fmt.Errorf("/proc/%d/stat: %w", p, err)
			}
			total += time.Duration(ticks) * 10 * time.Millisecond
		}
	}
	return total, nil
}

// machineBusy is the CPU time all processors spent busy (user, nice, system,
// irq, softirq), from the first line of /proc/stat.
func machineBusy() (time.Duration, error) {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, err
	}
	line, _, _ := strings.Cut(string(data), "\n")
	fields := strings.Fields(line)
	if len(fields) < 8 || fields[0] != "cpu" {
		return 0, errors.New("/proc/stat: no cpu line")
	}
	var total time.Duration
	for _, i := range []int{1, 2, 3, 6, 7} {
		ticks, err := strconv.ParseInt(fields[i], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/stat: %w", err)
		}
		total += time.Duration(ticks) * 10 * time.Millisecond
	}
	return total, nil
}

// raiseAutogroup gives the scheduling autogroup of this process, which its
// children inherit, the niceness nice. Linux groups processes by session for
// scheduling, so a niceness of each process would weigh nothing against the
// work of other sessions: the group's own does. Only a session leader changes
// its group, so that no other process's is touched.
func raiseAutogroup(nice int) string {
	const plain = "default, shared with other work on the machine"
	if nice == 0 {
		return plain
	}
	data, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		return plain + " (" + err.Error() + ")"
	}
	// Field 6 is the session, counted from after the command name.
	fields := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+1:]))
	if len(fields) < 4 || fields[3] != strconv.Itoa(os.Getpid()) {
		return plain + " (not a session leader: hack/bench-serve.sh runs the benchmark in a session of its own)"
	}
	if err := os.WriteFile("/proc/self/autogroup", []byte(strconv.Itoa(nice)), 0); err != nil {
		return plain + " (" + err.Error() + ")"
	}
	return fmt.Sprintf("an autogroup of its own at nice %d, against other work on the machine", nice)
}

// scrubReadBytes is osimages_scrub_read_bytes_total of the osimages server.
func scrubReadBytes(s *server) float64 {
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Get(s.url("/metrics"))
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "osimages_scrub_read_bytes_total "); ok {
			n, _ := strconv.ParseFloat(v, 64)
			return n
		}
	}
	return 0
}
