package oci

import "testing"

func TestCanonicalHost(t *testing.T) {
	for _, tc := range [][2]string{
		{"127.0.0.1:5000", "localhost:5000"},
		{"localhost:5000", "localhost:5000"},
		{"LOCALHOST:5000", "localhost:5000"},
		{"localhost.:5000", "localhost:5000"},
		{"[::ffff:127.0.0.1]:5000", "localhost:5000"},
		{"[::1]:5000", "localhost:5000"},
		{"[0:0:0:0:0:0:0:1]:5000", "localhost:5000"},
		{"127.1:5000", "localhost:5000"},
		{"0x7f000001:5000", "localhost:5000"},
		{"2130706433:5000", "localhost:5000"},
		// Other loopback addresses are other hosts.
		{"127.8.9.10:5000", "127.8.9.10:5000"},
		{"127.0.0.2:5000", "127.0.0.2:5000"},
		{"127.2:5000", "127.0.0.2:5000"},
		{"[::ffff:127.0.0.2]:5000", "127.0.0.2:5000"},
		{"[::]:5000", "localhost:5000"},
		{"0.0.0.0:5000", "localhost:5000"},
		{"registry.example.org", "registry.example.org"},
		{"Registry.Example.ORG.:443", "registry.example.org"},
		{"registry.example.org:80", "registry.example.org"},
		{"registry.example.org:5000", "registry.example.org:5000"},
		{"[::ffff:192.0.2.1]:5000", "192.0.2.1:5000"},
		{"[2001:DB8::1]", "[2001:db8::1]"},
		{"[2001:db8::1]:443", "[2001:db8::1]"},
		{"192.0.2.1", "192.0.2.1"},
		{"1.2.3.4.5", "1.2.3.4.5"},
	} {
		if got := CanonicalHost(tc[0]); got != tc[1] {
			t.Errorf("CanonicalHost(%q) = %q, want %q", tc[0], got, tc[1])
		}
	}
}

// TestCanonicalHostNeverMergesTwoAddresses: every spelling of one
// address is one host, and no two addresses are.
func TestCanonicalHostNeverMergesTwoAddresses(t *testing.T) {
	for _, pair := range [][2]string{
		{"127.0.0.1:5000", "127.0.0.2:5000"},
		{"localhost:5000", "127.0.0.2:5000"},
		{"127.0.0.1:5000", "127.255.255.254:5000"},
		{"[::1]:5000", "127.0.0.2:5000"},
		{"127.0.0.1:5000", "127.0.0.1:5001"},
	} {
		if a, b := CanonicalHost(pair[0]), CanonicalHost(pair[1]); a == b {
			t.Errorf("%s and %s are both %s: they are two hosts", pair[0], pair[1], a)
		}
	}
}

func TestCanonicalRepository(t *testing.T) {
	for _, tc := range [][2]string{
		{"oci://127.0.0.1:5000/dib", "localhost:5000/dib"},
		{"oci://localhost:5000/dib/good:1.0", "localhost:5000/dib/good"},
		{"oci://[::ffff:127.0.0.1]:5000/dib/good@sha256:abcd", "localhost:5000/dib/good"},
		{"oci://registry.example.org:443/Sylva/", "registry.example.org/sylva"},
		{"oci://registry.example.org", "registry.example.org"},
	} {
		if got, ok := CanonicalRepository(tc[0]); !ok || got != tc[1] {
			t.Errorf("CanonicalRepository(%q) = %q, want %q", tc[0], got, tc[1])
		}
	}
	if _, ok := CanonicalRepository("https://x/y"); ok {
		t.Error("an https URI has no registry repository")
	}
}
