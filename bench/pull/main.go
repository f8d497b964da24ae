// Command pull compares, in one run on one machine, the time to pull,
// verify and store a 1 GiB disk image published as a gzipped one-layer
// artifact in a registry on 127.0.0.1 (shared/docs/benchmarks.md, "Pull"):
//
//   - osimages: internal/pull into internal/imagestore, in process: one
//     streaming pass (blob digest, gunzip, sha256, md5, sparse write), then
//     fsync and commit;
//   - Sylva's way: oras pull, then gunzip, then sha256sum;
//   - the single-pass shell pipeline: curl of the blob | gunzip | sha256sum.
//
// It needs oras, curl, gzip and sha256sum on PATH (hack/bench-pull.sh sets
// that up).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sylva-projects/osimages/internal/devregistry"
	"github.com/sylva-projects/osimages/internal/imagestore"
	"github.com/sylva-projects/osimages/internal/oci"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/pull"
)

func main() {
	size := flag.Int64("size", 1<<30, "bytes of the image")
	runs := flag.Int("runs", 3, "runs of each method, interleaved; the median is reported")
	dir := flag.String("dir", "", "work directory (default: a new one under $TMPDIR, removed at the end)")
	only := flag.String("only", "", "run only the methods whose name contains this (osimages, Sylva, curl)")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the first osimages run to this file")
	flag.IntVar(&tuning.BufferSize, "buffer-size", 0, "pull.Puller.BufferSize (0: its default)")
	flag.IntVar(&tuning.Buffers, "buffers", 0, "pull.Puller.Buffers (0: its default)")
	flag.Parse()
	if err := run(*size, *runs, *dir, *only, *cpuprofile); err != nil {
		fmt.Fprintln(os.Stderr, "bench-pull:", err)
		os.Exit(1)
	}
}

// tuning holds the pipeline knobs given on the command line.
var tuning pull.Puller

type method struct {
	name  string
	run   func(i int) (time.Duration, error)
	times []time.Duration
}

func run(size int64, runs int, dir, only, cpuprofile string) error {
	for _, tool := range []string{"oras", "curl", "gzip", "gunzip", "sha256sum", "sh"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%s not found: run hack/bench-pull.sh, which builds and finds the tools", tool)
		}
	}
	if dir == "" {
		d, err := os.MkdirTemp("", "bench-pull-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(d)
		dir = d
	}
	ctx := context.Background()
	fmt.Printf("machine: %d CPUs, load average %s\n", runtime.NumCPU(), loadavg())

	// The image and its gzip -1 archive, on disk: 1 GiB is never held in
	// memory.
	start := time.Now()
	image := filepath.Join(dir, "bench-image.raw")
	if err := writeImage(image, size); err != nil {
		return err
	}
	layer := image + ".gz"
	if out, err := exec.Command("sh", "-c", fmt.Sprintf("gzip -1 -c %q > %q", image, layer)).CombinedOutput(); err != nil {
		return fmt.Errorf("gzip -1: %v: %s", err, out)
	}
	reg, err := devregistry.Start(ctx, devregistry.Options{RootDirectory: filepath.Join(dir, "registry")})
	if err != nil {
		return err
	}
	defer reg.Close()
	pub, err := reg.Publish(ctx, devregistry.DiskImage{
		Repository: "sylva-projects/dib/bench-image", Tag: "0.7.6",
		ContentFile: image, LayerFile: layer, Gzip: true,
	})
	if err != nil {
		return err
	}
	// Only the registry's copy is needed from now on.
	os.Remove(image)
	os.Remove(layer)
	f := pub.Fields
	want, err := osimage.ParseSHA256(f.Get(osimage.FieldSHA256))
	if err != nil {
		return err
	}
	archive, _ := strconv.ParseInt(f.Get(osimage.FieldArchiveSize), 10, 64)
	fmt.Printf("image: %d bytes (one MiB in four random), layer: %d bytes (gzip -1), sha256 %s\n", size, archive, want)
	fmt.Printf("registry: %s (filesystem storage), prepared in %.1fs\n\n", reg.URL(), time.Since(start).Seconds())

	src := pull.Source{
		URI: "oci://" + pub.Ref, SHA256: want, MD5: f.Get(osimage.FieldMD5),
		Compression: "gz", Size: size, ArchiveSize: archive,
	}
	client, err := oci.NewClient(oci.Options{Insecure: true, RegistryConfig: emptyDockerConfig(dir)})
	if err != nil {
		return err
	}
	puller := &pull.Puller{OCI: client, BufferSize: tuning.BufferSize, Buffers: tuning.Buffers}
	blobURL := fmt.Sprintf("%s/v2/sylva-projects/dib/bench-image/blobs/%s", reg.URL(), pub.LayerDigest)
	var allocated []uint64

	methods := []*method{
		{name: "osimages pull+verify+commit", run: func(i int) (time.Duration, error) {
			store, err := imagestore.Open(filepath.Join(dir, "store"))
			if err != nil {
				return 0, err
			}
			defer store.Close()
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			// As the image server pulls: into a resumable download,
			// checkpointed, committed in a second step timed apart.
			t0 := time.Now()
			w, err := store.Resume(src.SHA256)
			if err != nil {
				return 0, err
			}
			defer w.Abort()
			res, err := puller.Pull(ctx, src, w, nil)
			if err != nil {
				return 0, err
			}
			streamed := time.Since(t0)
			e := imagestore.Entry{SHA256: want, MD5: res.MD5, Filename: f.Get(osimage.FieldFilename), Size: res.Size}
			if err := w.Commit(e); err != nil {
				return 0, err
			}
			d := time.Since(t0)
			runtime.ReadMemStats(&after)
			allocated = append(allocated, after.TotalAlloc-before.TotalAlloc)
			if res.SHA256 != want.String() || res.NetworkBytes != archive {
				return 0, fmt.Errorf("pulled %+v", res)
			}
			fmt.Printf("       (stream %.2fs, fsync and commit %.2fs)\n", streamed.Seconds(), (d - streamed).Seconds())
			return d, store.Delete(e.SHA256)
		}},
		{name: "Sylva: oras pull; gunzip; sha256sum", run: func(i int) (time.Duration, error) {
			out := filepath.Join(dir, "sylva")
			defer os.RemoveAll(out)
			script := fmt.Sprintf("set -e; oras pull --plain-http -o %q %q >/dev/null; gunzip %q; sha256sum %q",
				out, pub.Ref, filepath.Join(out, f.Get(osimage.FieldFilename)+".gz"), filepath.Join(out, f.Get(osimage.FieldFilename)))
			return timeShell(script, want.String())
		}},
		{name: "curl blob | gunzip | sha256sum", run: func(i int) (time.Duration, error) {
			return timeShell(fmt.Sprintf("set -o pipefail; curl -sSf %q | gunzip | sha256sum", blobURL), want.String())
		}},
	}
	if only != "" {
		methods = slices.DeleteFunc(methods, func(m *method) bool { return !strings.Contains(m.name, only) })
	}
	if cpuprofile != "" {
		pf, err := os.Create(cpuprofile)
		if err != nil {
			return err
		}
		defer pf.Close()
		inner := methods[0].run
		methods[0].run = func(i int) (time.Duration, error) {
			if i == 0 {
				pprof.StartCPUProfile(pf)
				defer pprof.StopCPUProfile()
			}
			return inner(i)
		}
	}
	for i := range runs {
		for _, m := range methods {
			// Each method starts without dirty pages of the previous one.
			syscall.Sync()
			d, err := m.run(i)
			if err != nil {
				return fmt.Errorf("%s: %w", m.name, err)
			}
			m.times = append(m.times, d)
			fmt.Printf("run %d  %-38s %6.2fs\n", i+1, m.name, d.Seconds())
		}
	}

	if len(methods) < 3 {
		for _, m := range methods {
			fmt.Printf("  %-38s %6.2fs  (%s)\n", m.name, median(m.times).Seconds(), list(m.times))
		}
		return nil
	}
	ours, sylva, curl := median(methods[0].times), median(methods[1].times), median(methods[2].times)
	fmt.Printf("\nmedians of %d runs (same machine, same registry, interleaved):\n", runs)
	for _, m := range methods {
		fmt.Printf("  %-38s %6.2fs  (%s)\n", m.name, median(m.times).Seconds(), list(m.times))
	}
	fmt.Printf("  osimages allocated %.1f MiB per pull (Go heap, registry included)\n", float64(slices.Max(allocated))/(1<<20))
	fmt.Println()
	report := func(name string, ratio, target float64) bool {
		ok := ratio <= target
		verdict := "PASS"
		if !ok {
			verdict = "FAIL"
		}
		fmt.Printf("  osimages / %-32s %.2fx  (target <= %.1fx)  %s\n", name, ratio, target, verdict)
		return ok
	}
	ok := report("Sylva (oras, gunzip, sha256sum)", ours.Seconds()/sylva.Seconds(), 0.5)
	ok = report("curl | gunzip | sha256sum", ours.Seconds()/curl.Seconds(), 1.0) && ok
	if !ok {
		return fmt.Errorf("a target was missed")
	}
	return nil
}

// timeShell runs script with sh and checks that it printed sha256 want.
func timeShell(script, want string) (time.Duration, error) {
	t0 := time.Now()
	out, err := exec.Command("bash", "-c", script).CombinedOutput()
	d := time.Since(t0)
	if err != nil {
		return 0, fmt.Errorf("%v: %s", err, out)
	}
	if !strings.HasPrefix(strings.TrimSpace(string(out)), want) {
		return 0, fmt.Errorf("printed %q, want sha256 %s", out, want)
	}
	return d, nil
}

func writeImage(path string, size int64) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := devregistry.WriteDiskContent(f, size, 1); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// emptyDockerConfig keeps the benchmark away from the user's credentials.
func emptyDockerConfig(dir string) string {
	path := filepath.Join(dir, "docker-config.json")
	os.WriteFile(path, []byte("{}"), 0o600)
	return path
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

func list(ds []time.Duration) string {
	var parts []string
	for _, d := range ds {
		parts = append(parts, fmt.Sprintf("%.2f", d.Seconds()))
	}
	return strings.Join(parts, ", ")
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	fields := strings.Fields(string(b))
	if len(fields) < 3 {
		return "unknown"
	}
	return strings.Join(fields[:3], " ")
}
