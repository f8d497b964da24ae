package oci

import "testing"

// TestUnder is the table of the one "image under registry" rule: path
// boundaries, spellings that climb out, and spellings of the same host.
func TestUnder(t *testing.T) {
	const base = "oci://registry.example.org/sylva-projects/dib"
	for _, tc := range []struct {
		uri, base string
		want      bool
	}{
		{"oci://registry.example.org/sylva-projects/dib/ubuntu:1.0", base, true},
		{"oci://registry.example.org/sylva-projects/dib/a/b/c@sha256:" + sixtyFourZeros, base, true},
		{"oci://registry.example.org/sylva-projects/dib:1.0", base, true}, // the registry's own repository
		{"oci://registry.example.org/sylva-projects/dib/ubuntu:1.0", base + "/", true},
		{"oci://registry.example.org/sylva-projects/dib/ubuntu:1.0", base + "//", true},
		// Same host, other spellings.
		{"oci://REGISTRY.Example.org:443/sylva-projects/dib/ubuntu:1.0", base, true},
		{"oci://registry.example.org./sylva-projects/dib/ubuntu:1.0", base, true},
		{"oci://127.0.0.1:5000/sylva-projects/dib/x:1", "oci://localhost:5000/sylva-projects/dib", true},
		{"oci://[::1]:5000/sylva-projects/dib/x:1", "oci://127.0.0.1:5000/sylva-projects/dib/", true},
		// A whole registry declared.
		{"oci://registry.example.org/anything/x:1", "oci://registry.example.org", true},
		{"oci://registry.example.org/anything/x:1", "oci://registry.example.org/", true},
		// Another repository of the same host: the case.
		{"oci://registry.example.org/someone-else/evil:1.0", base, false},
		{"oci://registry.example.org/sylva-projects/dib-evil/x:1", base, false},
		{"oci://registry.example.org/sylva-projects/dibx:1", base, false},
		{"oci://registry.example.org/sylva-projects:1", base, false},
		// Climbing out, however spelled: no valid repository name.
		{"oci://registry.example.org/sylva-projects/dib/../../someone-else/evil:1.0", base, false},
		{"oci://registry.example.org/sylva-projects/dib/./x:1", base, false},
		{"oci://registry.example.org/sylva-projects/dib/%2e%2e/evil:1.0", base, false},
		{"oci://registry.example.org/sylva-projects/dib/%2E%2E/evil:1.0", base, false},
		{"oci://registry.example.org/sylva-projects/dib//x:1", base, false},
		{"oci://registry.example.org/sylva-projects/dib/x?y=/../z:1", base, false},
		// Other hosts, ports and schemes.
		{"oci://registry.example.org:5000/sylva-projects/dib/x:1", base, false},
		{"oci://registry.example.org.evil.com/sylva-projects/dib/x:1", base, false},
		{"oci://evil.com@registry.example.org/sylva-projects/dib/x:1", base, false},
		{"oci://127.0.0.2:5000/sylva-projects/dib/x:1", "oci://127.0.0.1:5000/sylva-projects/dib", false},
		{"https://registry.example.org/sylva-projects/dib/x.qcow2", base, false},
		{"oci://registry.example.org/sylva-projects/dib/x:1", "https://registry.example.org/sylva-projects/dib", false},
		{"registry.example.org/sylva-projects/dib/x:1", base, false},
		// A base that is itself no repository name holds nothing.
		{"oci://registry.example.org/sylva-projects/dib/x:1", "oci://registry.example.org/sylva-projects/%64ib", false},
		{"oci://registry.example.org/x:1", "oci:///x", false},
	} {
		if got := Under(tc.uri, tc.base); got != tc.want {
			t.Errorf("Under(%q, %q) = %v, want %v", tc.uri, tc.base, got, tc.want)
		}
	}
}

const sixtyFourZeros = "0000000000000000000000000000000000000000000000000000000000000000"
