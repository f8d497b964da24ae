package catalog

import (
	"strings"
	"testing"

	"github.com/sylva-projects/osimages/internal/values"
)

func TestRegistryAllowlist(t *testing.T) {
	v, err := values.Parse([]byte(`
sylva_base_oci_registry: oci://Registry.Example.org:443/sylva-projects
os_images_oci_registries:
  sylva: {url: '{{ .Values.sylva_base_oci_registry }}/dib', tag: '1'}
  off: {url: 'oci://off.example.org/x', enabled: false}
`))
	if err != nil {
		t.Fatal(err)
	}
	hosts, err := RegistryHosts(v)
	if err != nil {
		t.Fatal(err)
	}
	a := NewRegistryAllowlist(append(hosts, "10.0.0.1:5000", "oci://mirror.example.org/any/path")...)
	if got := strings.Join(a.hosts, ","); got != "10.0.0.1:5000,mirror.example.org,registry.example.org" {
		t.Errorf("hosts: %s", got)
	}
	ok := Plan{Sources: []Source{
		{Key: "a", URI: "oci://registry.example.org/sylva-projects/dib/a:1"},
		{Key: "b", URI: "oci://REGISTRY.example.org:443/elsewhere/b:1"},
		{Key: "c", URI: "oci://10.0.0.1:5000/c@sha256:" + strings.Repeat("0", 64)},
		{Key: "d", URI: "https://files.example.org/d.raw"},
	}}
	if err := a.Admit(ok); err != nil {
		t.Errorf("allowed plan refused: %v", err)
	}
	bad := Plan{Sources: append(ok.Sources,
		Source{Key: "scan", URI: "oci://10.0.0.1:6443/x:1"},
		Source{Key: "off", URI: "oci://off.example.org/x/y:1"})}
	err = a.Admit(bad)
	for _, want := range []string{"os_images.scan (oci://10.0.0.1:6443/x:1): registry 10.0.0.1:6443 is not one", "os_images.off", "allowed registries: 10.0.0.1:5000, mirror.example.org, registry.example.org", "nothing was fetched"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("want %q in %v", want, err)
		}
	}
	if err := (*RegistryAllowlist)(nil).Admit(bad); err != nil {
		t.Errorf("no allowlist: %v", err)
	}
	if err := NewRegistryAllowlist().Admit(bad); err == nil || !strings.Contains(err.Error(), "allowed registries: none") {
		t.Errorf("empty allowlist: %v", err)
	}
}
