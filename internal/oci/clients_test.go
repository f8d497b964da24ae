package oci_test

import (
	"context"
	"testing"

	"github.com/sylva-projects/osimages/internal/devregistry"
	"github.com/sylva-projects/osimages/internal/oci"
)

// The pair built from one set of options reaches a real registry on
// 127.0.0.1 as oci_registry_insecure says: the secure client refuses a
// certificate it cannot verify and a plain-HTTP registry, the insecure one
// reaches both, and a CA file given once is trusted by both.
func TestClientsAgainstRegistry(t *testing.T) {
	ctx := context.Background()
	publish := func(tls bool) (*devregistry.Registry, string) {
		t.Helper()
		reg, err := devregistry.Start(ctx, devregistry.Options{TLS: tls})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { reg.Close() })
		p, err := reg.Publish(ctx, devregistry.DiskImage{Repository: "sylva/image", Tag: "1.0", Content: []byte("disk")})
		if err != nil {
			t.Fatal(err)
		}
		return reg, "oci://" + p.Ref
	}
	tlsReg, tlsRef := publish(true)
	_, plainRef := publish(false)

	fetch := func(c *oci.Client, ref string) error {
		_, err := c.FetchManifest(ctx, ref)
		return err
	}
	noCA, err := oci.NewClients(oci.Options{})
	if err != nil {
		t.Fatal(err)
	}
	withCA, err := oci.NewClients(oci.Options{CAFile: tlsReg.CAFile})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		client  *oci.Client
		ref     string
		reaches bool
	}{
		{"secure, unknown CA", noCA.Secure, tlsRef, false},
		{"insecure, unknown CA", noCA.Insecure, tlsRef, true},
		{"secure, --ca-file", withCA.Secure, tlsRef, true},
		{"insecure, --ca-file", withCA.Insecure, tlsRef, true},
		{"secure, plain HTTP", noCA.Secure, plainRef, false},
		{"insecure, plain HTTP", noCA.Insecure, plainRef, true},
	} {
		err := fetch(tc.client, tc.ref)
		if tc.reaches && err != nil {
			t.Errorf("%s: %v", tc.name, err)
		}
		if !tc.reaches && err == nil {
			t.Errorf("%s: fetched %s, want a refusal", tc.name, tc.ref)
		}
	}
}
