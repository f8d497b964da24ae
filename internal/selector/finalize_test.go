package selector

import (
	"strings"
	"testing"

	"github.com/sylva-projects/osimages/internal/osimage"
)

func TestK8sVersionPattern(t *testing.T) {
	for in, want := range map[string]string{
		"v1.32.5+rke2r1":      `1.32.5\+rke2r1`,
		"1.32.5+rke2r1":       `1.32.5\+rke2r1`,
		"v1.33.0-rc.1+k3s1+x": `1.33.0-rc.1\+k3s1\+x`,
		"v1.31.4":             `1.31.4`,
		"vv1.31.4":            `v1.31.4`,
	} {
		if got := K8sVersionPattern(in); got != want {
			t.Errorf("K8sVersionPattern(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestFinalize(t *testing.T) {
	rke2 := Cluster{K8sVersion: "v1.32.5+rke2r1", BootstrapProvider: "cabpr"}
	tests := []struct {
		name    string
		sel     map[string]any
		cluster Cluster
		want    map[string]string
		errHas  []string
	}{
		{
			name: "adds the three keys", sel: map[string]any{"os": "ubuntu"}, cluster: rke2,
			want: map[string]string{"os": "ubuntu", "k8s-version": `1.32.5\+rke2r1`, "k8s-flavor": "rke2", "oci-image-registry-key": ".*"},
		},
		{
			name: "keeps what the user set", cluster: rke2,
			sel:  map[string]any{"k8s-version": "1.31.*", "k8s-flavor": "kubeadm", "oci-image-registry-key": "mine"},
			want: map[string]string{"k8s-version": "1.31.*", "k8s-flavor": "kubeadm", "oci-image-registry-key": "mine"},
		},
		{
			name: "kubeadm", sel: map[string]any{}, cluster: Cluster{K8sVersion: "v1.31.4", BootstrapProvider: "cabpk"},
			want: map[string]string{"k8s-version": "1.31.4", "k8s-flavor": "kubeadm", "oci-image-registry-key": ".*"},
		},
		{
			name: "ck8s", sel: map[string]any{}, cluster: Cluster{K8sVersion: "1.31.4", BootstrapProvider: "cabpck"},
			want: map[string]string{"k8s-version": "1.31.4", "k8s-flavor": "ck8s", "oci-image-registry-key": ".*"},
		},
		{
			name: "openshift", sel: map[string]any{}, cluster: Cluster{K8sVersion: "v4.17", BootstrapProvider: "cabpoa"},
			want: map[string]string{"k8s-version": "4.17", "k8s-flavor": "openshift", "oci-image-registry-key": ".*"},
		},
		{
			name: "autoselect registries", sel: map[string]any{},
			cluster: Cluster{K8sVersion: "v1.31.4", BootstrapProvider: "cabpk", AutoselectRegistries: "sylva|local"},
			want:    map[string]string{"k8s-version": "1.31.4", "k8s-flavor": "kubeadm", "oci-image-registry-key": "sylva|local"},
		},
		{
			name: "unknown bootstrap provider", sel: map[string]any{}, cluster: Cluster{K8sVersion: "v1.31.4", BootstrapProvider: "cabpx"},
			errHas: []string{`bootstrap provider "cabpx"`, "cabpck, cabpk, cabpoa, cabpr"},
		},
		{
			name: "no bootstrap provider", sel: map[string]any{}, cluster: Cluster{K8sVersion: "v1.31.4"},
			errHas: []string{`bootstrap provider ""`},
		},
		{
			name: "unknown bootstrap provider is fine when k8s-flavor is set", sel: map[string]any{"k8s-flavor": "okd"},
			cluster: Cluster{K8sVersion: "v1.31.4", BootstrapProvider: "cabpob"},
			want:    map[string]string{"k8s-version": "1.31.4", "k8s-flavor": "okd", "oci-image-registry-key": ".*"},
		},
		{
			name: "no k8s_version", sel: map[string]any{}, cluster: Cluster{BootstrapProvider: "cabpk"},
			errHas: []string{"k8s_version is not set"},
		},
		{
			name: "no k8s_version is fine when k8s-version is set", sel: map[string]any{"k8s-version": ".*"}, cluster: Cluster{BootstrapProvider: "cabpk"},
			want: map[string]string{"k8s-version": ".*", "k8s-flavor": "kubeadm", "oci-image-registry-key": ".*"},
		},
		{
			name: "k8s_version that is no regexp", sel: map[string]any{}, cluster: Cluster{K8sVersion: "v1.31(", BootstrapProvider: "cabpk"},
			errHas: []string{`k8s_version "v1.31("`, "invalid regular expression"},
		},
		{
			name: "bad autoselect registries", sel: map[string]any{},
			cluster: Cluster{K8sVersion: "v1.31.4", BootstrapProvider: "cabpk", AutoselectRegistries: "[a"},
			errHas:  []string{"os_image_selector_autoselect_registries", `"[a"`},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := mustParse(t, tt.sel)
			before := in.String()
			got, err := Finalize(in, tt.cluster)
			if in.String() != before {
				t.Errorf("Finalize changed its input: %s -> %s", before, in)
			}
			if tt.errHas != nil {
				if err == nil {
					t.Fatalf("no error, want one")
				}
				for _, sub := range tt.errHas {
					if !strings.Contains(err.Error(), sub) {
						t.Errorf("error %q lacks %q", err, sub)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			m := got.Map()
			if len(m) != len(tt.want) {
				t.Fatalf("got %v, want %v", m, tt.want)
			}
			for k, v := range tt.want {
				if m[k] != v {
					t.Errorf("%s: got %q, want %q", k, m[k], v)
				}
			}
		})
	}
}

// The finalized selector must pick images built for exactly the cluster's
// version, including its "+" build metadata.
func TestFinalizeMatching(t *testing.T) {
	sel, err := Finalize(mustParse(t, map[string]any{"os": "ubuntu"}), Cluster{K8sVersion: "v1.32.5+rke2r1", BootstrapProvider: "cabpr"})
	if err != nil {
		t.Fatal(err)
	}
	base := osimage.Image{"os": "ubuntu", "k8s-flavor": "rke2", "oci-image-registry-key": "sylva"}
	for version, want := range map[string]bool{
		"1.32.5+rke2r1":  true,
		"1.32.5":         false,
		"1.32.5+rke2r2":  false,
		"1.32.50+rke2r1": false,
		"v1.32.5+rke2r1": false,
	} {
		img := base.Clone()
		img["k8s-version"] = version
		if got, err := sel.Matches("k", img); err != nil || got != want {
			t.Errorf("k8s-version %s: match %v, want %v", version, got, want)
		}
	}
	// Images declared by hand have no registry key; the default pattern
	// still lets them be picked.
	img := base.Clone()
	delete(img, "oci-image-registry-key")
	img["k8s-version"] = "1.32.5+rke2r1"
	if ok, err := sel.Matches("k", img); err != nil || !ok {
		t.Error("an image without oci-image-registry-key must match the default .*")
	}
}
