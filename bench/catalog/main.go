// Command catalog compares, in one run on one machine, the time to resolve
// the metadata of 50 diskimage-builder artifacts from a registry on
// 127.0.0.1 with `osimages catalog` and with the per-image loop of Sylva's
// os-images-info script (shared/docs/benchmarks.md, "Catalog"). It also
// measures what cosign signature verification adds: every artifact is
// signed, and `osimages catalog` runs with and without the registry's
// cosign_publickey.
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

	signer, err := devregistry.NewSigner()
	if err != nil {
		return err
	}
	var values, signedValues, images, loop, cosignLoop strings.Builder
	cosignLoop.WriteString("set -e\n")
	fmt.Fprintf(&values, "sylva_base_oci_registry: oci://%s/sylva-projects\noci_registry_insecure: true\n", reg.Host)
	values.WriteString("os_images_oci_registries:\n  sylva:\n    url: '{{ .Values.sylva_base_oci_registry }}/dib'\n    tag: 0.7.6\n")
	signedValues.WriteString(values.String())
	fmt.Fprintf(&signedValues, "    cosign_publickey: |\n      %s\n", strings.ReplaceAll(strings.TrimSpace(signer.PublicKeyPEM), "\n", "\n      "))
	values.WriteString("sylva_diskimagebuilder_images:\n")
	signedValues.WriteString("sylva_diskimagebuilder_images:\n")
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
		if err := reg.Sign(ctx, signer, "sylva-projects/dib/"+name, p.ManifestDigest, devregistry.SignOptions{}); err != nil {
			return err
		}
		fmt.Fprintf(&values, "  %s: {os_images_oci_registry: sylva}\n", name)
		fmt.Fprintf(&signedValues, "  %s: {os_images_oci_registry: sylva}\n", name)
		fmt.Fprintf(&images, "  %s: {os_images_oci_registry: sylva}\n", name)
		// The loop of Sylva's os-images-info script, without its cosign
		// step, exactly as shared/docs/benchmarks.md defines it.
		fmt.Fprintf(&loop, "m=$(oras manifest fetch --plain-http %s)\n", p.Ref)
		fmt.Fprintf(&loop, "echo \"$m\" | yq -p json '.annotations | with_entries(select(.key|contains(\"sylva\")))' -P | sed 's|.*/|        |'\n")
		fmt.Fprintf(&loop, "yq '.os_images.%s' %s/images.yaml\n", name, dir)
		fmt.Fprintf(&cosignLoop, "\"$OSIMAGES_COSIGN\" verify --key %s/cosign.pub --insecure-ignore-tlog=true --new-bundle-format=false --allow-http-registry %s >/dev/null 2>&1\n", dir, p.Ref)
	}
	files := map[string]string{"values.yaml": values.String(), "signed.yaml": signedValues.String(), "images.yaml": images.String(), "loop.sh": loop.String(),
		"cosign.sh": cosignLoop.String(), "cosign.pub": signer.PublicKeyPEM}
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
	verifyingCmd := []string{binary, "catalog", "-f", filepath.Join(dir, "signed.yaml")}
	// Check the output once, so that a broken run cannot pass for a fast one.
	for _, argv := range [][]string{osimagesCmd, verifyingCmd} {
		out, err := exec.Command(argv[0], argv[1:]...).Output()
		if err != nil {
			return fmt.Errorf("%s: %w", strings.Join(argv, " "), err)
		}
		if got := strings.Count(string(out), "sha256: "); got != n {
			return fmt.Errorf("%s resolved %d images, want %d", strings.Join(argv, " "), got, n)
		}
	}
	// And once that verification really refuses: the same artifacts
	// against another key must all fail.
	other, err := devregistry.NewSigner()
	if err != nil {
		return err
	}
	wrongKey := strings.Replace(signedValues.String(),
		strings.ReplaceAll(strings.TrimSpace(signer.PublicKeyPEM), "\n", "\n      "),
		strings.ReplaceAll(strings.TrimSpace(other.PublicKeyPEM), "\n", "\n      "), 1)
	if err := os.WriteFile(filepath.Join(dir, "wrong.yaml"), []byte(wrongKey), 0o600); err != nil {
		return err
	}
	out, err := exec.Command(binary, "catalog", "-f", filepath.Join(dir, "wrong.yaml")).CombinedOutput()
	if err == nil || !strings.Contains(string(out), fmt.Sprintf("%d of %d images could not be resolved", n, n)) {
		return fmt.Errorf("with another key, want every image refused; got %v:\n%s", err, out)
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
	// Interleaved with the unsigned runs, so that both see the same load.
	plain2, verifying, err := medianPair(runs, osimagesCmd, verifyingCmd)
	if err != nil {
		return err
	}
	fmt.Printf("  osimages catalog (whole process)        %8.3f s\n", ours.Seconds())
	fmt.Printf("  Sylva loop (oras + yq + sed per image)  %8.3f s   %6.1fx slower than osimages\n", sylva.Seconds(), sylva.Seconds()/ours.Seconds())
	fmt.Printf("  oras manifest fetch alone, in sequence  %8.3f s   %6.1fx slower than osimages\n", fetch.Seconds(), fetch.Seconds()/ours.Seconds())
	fmt.Printf("signature verification (every artifact signed, cosign .sig tags), interleaved runs:\n")
	fmt.Printf("  osimages catalog, no cosign_publickey   %8.3f s\n", plain2.Seconds())
	fmt.Printf("  osimages catalog, verifying %3d sigs    %8.3f s   %6.2fx, +%.3f s (%.1f ms per artifact)\n",
		n, verifying.Seconds(), verifying.Seconds()/plain2.Seconds(), (verifying - plain2).Seconds(), float64((verifying-plain2).Microseconds())/1000/float64(n))
	// Sylva's os-images-info runs one cosign verify per image besides the
	// loop above; shown when hack/tools.sh has built cosign.
	if os.Getenv("OSIMAGES_COSIGN") != "" {
		cosign, err := median(runs, []string{"bash", filepath.Join(dir, "cosign.sh")})
		if err != nil {
			return err
		}
		fmt.Printf("  Sylva's step: cosign verify per image   %8.3f s   %6.1fx the time osimages adds\n", cosign.Seconds(), cosign.Seconds()/(verifying-plain2).Seconds())
	}
	return nil
}

// medianPair runs a and b alternately, runs times each, and returns the
// median of each.
func medianPair(runs int, a, b []string) (time.Duration, time.Duration, error) {
	ta, tb := make([]time.Duration, runs), make([]time.Duration, runs)
	for i := range runs {
		for _, x := range []struct {
			argv []string
			out  []time.Duration
		}{{a, ta}, {b, tb}} {
			d, err := median(1, x.argv)
			if err != nil {
				return 0, 0, err
			}
			x.out[i] = d
		}
	}
	slices.Sort(ta)
	slices.Sort(tb)
	return ta[runs/2], tb[runs/2], nil
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
