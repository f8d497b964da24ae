package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// A hostile template in the values is refused at once, as an input error
// naming the value. Eight nested range over a 100-item list ran for 13
// minutes and ignored SIGTERM; a self-referencing value repeated 10 times
// took 1.2 GB and crashed the process.
func TestCatalogRefusesHostileTemplates(t *testing.T) {
	list := "list: [" + strings.Repeat("0, ", 99) + "0]\n"
	for name, doc := range map[string]string{
		"nested range":   list + "os_images_oci_registries:\n  evil:\n    url: 'oci://r/{{" + strings.Repeat("range .Values.list}}{{", 8) + "end}}" + strings.Repeat("{{end}}", 7) + "'\n    tag: '1'\n",
		"self reference": "a: '" + strings.Repeat("{{ .Values.a }}", 10) + "'\nos_images_oci_registries:\n  evil:\n    url: 'oci://r/{{ .Values.a }}'\n    tag: '1'\n",
	} {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, binary, "catalog", "-f", writeFile(t, "values.yaml", doc))
			cmd.Env = append(os.Environ(), "DOCKER_CONFIG="+t.TempDir(), "GOMEMLIMIT=256MiB")
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			err := cmd.Run()
			var exitErr *exec.ExitError
			if ctx.Err() != nil || !errors.As(err, &exitErr) || exitErr.ExitCode() != 2 {
				t.Fatalf("want exit 2 at once, got %v (%v)\n%s", err, ctx.Err(), stderr.String())
			}
			if !strings.Contains(stderr.String(), "os_images_oci_registries.evil.url: ") || !strings.Contains(stderr.String(), "values template refused") {
				t.Errorf("stderr: %s", stderr.String())
			}
		})
	}
}

// A registry whose url is refused has that one error: the images that
// name it do not add a second, wrong one saying it is not defined.
func TestCatalogReportsARefusedRegistryOnce(t *testing.T) {
	doc := `os_images_oci_registries:
  sylva:
    url: 'oci://{{ range .Values.x }}{{ end }}registry.example.org/dib'
    tag: '1.0'
  missing-tag: {url: 'oci://registry.example.org/dib'}
sylva_diskimagebuilder_images:
  ubuntu: {os_images_oci_registry: sylva}
  ubuntu-too: {os_images_oci_registry: missing-tag}
  ubuntu-nowhere: {os_images_oci_registry: nowhere}
`
	r := run(t, "catalog", "-f", writeFile(t, "values.yaml", doc))
	if r.code != 2 || r.stdout != "" {
		t.Fatalf("exit %d, stdout %q; want exit 2 and nothing printed", r.code, r.stdout)
	}
	for _, want := range []string{
		"os_images_oci_registries.sylva.url: values template refused",
		"os_images_oci_registries.missing-tag.tag: missing",
		// A registry that is not declared at all still is reported.
		"sylva_diskimagebuilder_images.ubuntu-nowhere.os_images_oci_registry ('nowhere') is not defined",
	} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, r.stderr)
		}
	}
	for _, spurious := range []string{"('sylva') is not defined", "('missing-tag') is not defined"} {
		if strings.Contains(r.stderr, spurious) {
			t.Errorf("stderr says %q of a registry that is declared:\n%s", spurious, r.stderr)
		}
	}
}
