// Command catalog compares, in one run on one machine, the time to resolve
// the metadata of 50 diskimage-builder artifacts from a registry on
// 127.0.0.1 with `osimages catalog` and with the per-image loop of Sylva's
// os-images-info script (shared/docs/benchmarks.md, "Catalog").
//
// It needs oras and the Go yq on PATH (hack/bench-catalog.sh sets that up).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/sylva-projects/osimages/internal/devregistry"
	"github.com/sylva-projects/osimages/internal/osimage"
)

func main() {
	images := flag.Int("images", 50, "artifacts to resolve")
	runs := flag.Int("runs", 5, "runs of each method; the median is reported")
	binary := flag.String("osimages", "bin/osimages", "osimages binary")
	flag.Parse()
	if err := run(*images, *runs, *binary); err != nil {
		fmt.Fprintln(os.Stderr, "bench-catalog:", err)
		os.Exit(1)
	}
}

func run(n, runs int, binary string) error {
	for _, tool := range []string{"oras", "yq", binary} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%s not found: run hack/bench-catalog.sh, which builds and finds the tools", tool)
		}
	}
	ctx := context.Background()
	reg, err := devregistry.Start(ctx, devregistry.Options{})
	if err != nil {
		return err
	}
	defer reg.Close()
	dir, err := os.MkdirTemp("", "bench-catalog-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	var values, images, loop strings.Builder
	fmt.Fprintf(&values, "sylva_base_oci_registry: oci://%s/sylva-projects\noci_registry_insecure: true\n", reg.Host)
	values.WriteString("os_images_oci_registries:\n  sylva:\n    url: '{{ .Values.sylva_base_oci_registry }}/dib'\n    tag: 0.7.6\n")
	values.WriteString("sylva_diskimagebuilder_images:\n")
	images.WriteString("os_images:\n")
	loop.WriteString("set -e\n")
	for i := range n {
		name := fmt.Sprintf("ubuntu-noble-plain-rke2-%03d", i)
		p, err := reg.Publish(ctx, devregistry.DiskImage{
			Repository: "sylva-projects/dib/" + name, Tag: "0.7.6", Gzip: true,
			Content: devregistry.DiskContent(16<<10, uint64(i)),
			Fields:  osimage.Image{"os": "ubuntu", "os-release": "noble", "k8s-flavor": "rke2", "k8s-version": "1.32.5+rke2r1"},
		})
		if err != nil {
			return err
		}
		fmt.Fprintf(&values, "  %s: {os_images_oci_registry: sylva}\n", name)
		fmt.Fprintf(&images, "  %s: {os_images_oci_registry: sylva}\n", name)
		// The loop of Sylva's os-images-info script, without its cosign
		// step, exactly as shared/docs/benchmarks.md defines it.
		fmt.Fprintf(&loop, "m=$(oras manifest fetch --plain-http %s)\n", p.Ref)
		fmt.Fprintf(&loop, "echo \"$m\" | yq -p json '.annotations | with_entries(select(.key|contains(\"sylva\")))' -P | sed 's|.*/|        |'\n")
		fmt.Fprintf(&loop, "yq '.os_images.%s' %s/images.yaml\n", name, dir)
	}
	files := map[string]string{"values.yaml": values.String(), "images.yaml": images.String(), "loop.sh": loop.String()}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			return err
		}
	}
	fetchOnly := strings.Builder{}
	for _, line := range strings.Split(loop.String(), "\n") {
		if strings.HasPrefix(line, "m=$(oras") || line == "set -e" {
			fetchOnly.WriteString(line + "\n")
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "fetch.sh"), []byte(fetchOnly.String()), 0o600); err != nil {
		return err
	}

	osimagesCmd := []string{binary, "catalog", "-f", filepath.Join(dir, "values.yaml")}
	// Check the output once, so that a broken run cannot pass for a fast one.
	out, err := exec.Command(osimagesCmd[0], osimagesCmd[1:]...).Output()
	if err != nil {
		return fmt.Errorf("osimages catalog: %w", err)
	}
	if got := strings.Count(string(out), "sha256: "); got != n {
		return fmt.Errorf("osimages catalog resolved %d images, want %d", got, n)
	}

	fmt.Printf("catalog benchmark: %d artifacts on a registry at 127.0.0.1, median of %d runs each\n", n, runs)
	ours, err := median(runs, osimagesCmd)
	if err != nil {
		return err
	}
	sylva, err := median(runs, []string{"bash", filepath.Join(dir, "loop.sh")})
	if err != nil {
		return err
	}
	fetch, err := median(runs, []string{"bash", filepath.Join(dir, "fetch.sh")})
	if err != nil {
		return err
	}
	fmt.Printf("  osimages catalog (whole process)        %8.3f s\n", ours.Seconds())
	fmt.Printf("  Sylva loop (oras + yq + sed per image)  %8.3f s   %6.1fx slower than osimages\n", sylva.Seconds(), sylva.Seconds()/ours.Seconds())
	fmt.Printf("  oras manifest fetch alone, in sequence  %8.3f s   %6.1fx slower than osimages\n", fetch.Seconds(), fetch.Seconds()/ours.Seconds())
	return nil
}

func median(runs int, argv []string) (time.Duration, error) {
	times := make([]time.Duration, runs)
	for i := range runs {
		cmd := exec.Command(argv[0], argv[1:]...)
		start := time.Now()
		if out, err := cmd.CombinedOutput(); err != nil {
			return 0, fmt.Errorf("%s: %w\n%s", strings.Join(argv, " "), err, out)
		}
		times[i] = time.Since(start)
	}
	slices.Sort(times)
	return times[runs/2], nil
}
