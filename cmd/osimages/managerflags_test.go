package main

import (
	"strings"
	"testing"
)

// controller and propagate share one set of manager flags, validated the
// same way: the controller used not to check the apiserver rate at all.
func TestManagerCommandsRefuseBadAPIRate(t *testing.T) {
	for _, command := range []string{"controller", "propagate"} {
		for _, tc := range []struct {
			args []string
			want string
		}{
			{[]string{"--kube-api-qps", "0"}, "--kube-api-qps 0 and --kube-api-burst 500: must be positive"},
			{[]string{"--kube-api-qps", "-5"}, "--kube-api-qps -5 and --kube-api-burst 500: must be positive"},
			{[]string{"--kube-api-burst", "0"}, "--kube-api-qps 200 and --kube-api-burst 0: must be positive"},
			{[]string{"--log-format", "xml"}, `--log-format "xml": want json or text`},
		} {
			// A kubeconfig that cannot be read: the flags must be refused
			// before the cluster is looked for.
			r := run(t, append([]string{command, "--kubeconfig", "/nonexistent"}, tc.args...)...)
			if r.code != 2 || !strings.Contains(r.stderr, tc.want) {
				t.Errorf("%s %v: exit %d, stderr %q; want exit 2 saying %q", command, tc.args, r.code, r.stderr, tc.want)
			}
		}
	}
}

// With --catalog on, the controller must be told which registries the
// namespaces' catalogs may reach: without it, a tenant's values would make
// it connect anywhere (issue 23, item 14).
func TestControllerNeedsToKnowWhichRegistriesCatalogsMayReach(t *testing.T) {
	r := run(t, "controller", "--kubeconfig", "/nonexistent")
	if r.code != 2 || !strings.Contains(r.stderr, "--catalog-registries-from") || !strings.Contains(r.stderr, "--catalog-allow-any-registry") {
		t.Errorf("exit %d, stderr %q; want exit 2 naming the flags", r.code, r.stderr)
	}
	values := writeFile(t, "mgmt.yaml", "os_images_oci_registries:\n  sylva: {url: 'oci://{{ .Values.base }}/dib'}\nbase: registry.example.org\n")
	for _, args := range [][]string{
		{"--catalog-allow-any-registry", "--catalog-allow-registry", "r.example.org"},
		{"--catalog-registries-from", "/nonexistent.yaml"},
		{"--catalog-allow-registry", ""},
	} {
		r := run(t, append([]string{"controller", "--kubeconfig", "/nonexistent"}, args...)...)
		if r.code != 2 || !strings.Contains(r.stderr, "--catalog-") {
			t.Errorf("%v: exit %d, stderr %q; want exit 2 naming the flag", args, r.code, r.stderr)
		}
	}
	// Good registry flags pass to the next check: the kubeconfig.
	r = run(t, "controller", "--kubeconfig", "/nonexistent", "--catalog-registries-from", values)
	if strings.Contains(r.stderr, "--catalog-") {
		t.Errorf("good registry flags refused: %q", r.stderr)
	}
}
