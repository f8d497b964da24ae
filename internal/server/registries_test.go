package server

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/sylva-projects/osimages/internal/devregistry"
	"github.com/sylva-projects/osimages/internal/fill"
	"github.com/sylva-projects/osimages/internal/imagestore"
	"github.com/sylva-projects/osimages/internal/oci"
	"github.com/sylva-projects/osimages/internal/testenv"
	"github.com/sylva-projects/osimages/internal/values"
)

// The registry settings of the management values in force: nothing OCI is
// pulled before the first values are applied (fail closed), the insecure
// switch follows oci_registry_insecure, and values whose keys cannot be
// read stop OCI pulls until good ones come. The registry speaks plain HTTP,
// which only the insecure client reaches.
func TestRegistriesFollowTheValuesInForce(t *testing.T) {
	s := newSignedSetup(t)
	w, p := s.publish(t, "signed", 1)
	testenv.Sign(t, s.reg, s.ours, p, devregistry.SignOptions{})
	clients, err := oci.NewClients(oci.Options{})
	if err != nil {
		t.Fatal(err)
	}
	regs := fill.NewRegistries(clients, DefaultStallTimeout, nil)
	pull := regs.Fill()
	try := func(what string) error {
		t.Helper()
		store, err := imagestore.Open(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		defer store.Close()
		dst, err := store.Create(w.SHA256)
		if err != nil {
			t.Fatal(err)
		}
		defer dst.Abort()
		_, err = pull(context.Background(), w, dst, nil)
		t.Logf("%s: %v", what, err)
		return err
	}
	mgmt := func(insecure bool, key string) values.Values {
		t.Helper()
		doc := fmt.Sprintf("oci_registry_insecure: %t\nos_images_oci_registries:\n  sylva:\n    url: oci://%s/dib\n    tag: \"1.0\"\n    cosign_publickey: |\n      %s\n",
			insecure, s.reg.Host, strings.ReplaceAll(strings.TrimSpace(key), "\n", "\n      "))
		v, err := values.Parse([]byte(doc))
		if err != nil {
			t.Fatal(err)
		}
		return v
	}

	if err := try("before any values"); err == nil || !strings.Contains(err.Error(), "the management values are not read yet") {
		t.Errorf("pull before any values: %v, want a refusal saying the values are not read yet", err)
	}
	if s.blobs.fetched(p.LayerDigest.String()) {
		t.Fatal("downloaded before the signature policy was known")
	}
	if err := regs.Apply(mgmt(false, s.ours.PublicKeyPEM)); err != nil {
		t.Fatal(err)
	}
	if err := try("secure client, plain-HTTP registry"); err == nil {
		t.Error("the secure client reached a plain-HTTP registry")
	}
	if err := regs.Apply(mgmt(true, s.ours.PublicKeyPEM)); err != nil {
		t.Fatal(err)
	}
	if err := try("oci_registry_insecure: true"); err != nil {
		t.Errorf("insecure pull of a signed image: %v", err)
	}
	if err := regs.Apply(mgmt(true, "not a key")); err == nil || !strings.Contains(err.Error(), "OCI images are not pulled until the cosign keys can be read") {
		t.Errorf("Apply of an unreadable key: %v", err)
	}
	if err := try("unreadable key"); err == nil {
		t.Error("pulled while the cosign keys of the values in force cannot be read")
	}
}
