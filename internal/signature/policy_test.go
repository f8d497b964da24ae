package signature_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/opencontainers/go-digest"

	"github.com/sylva-projects/osimages/internal/signature"
	"github.com/sylva-projects/osimages/internal/testenv"
)

func TestPolicyKeysFor(t *testing.T) {
	tr := signature.Policy{Keys: []signature.Key{
		{Registry: "sylva", URL: "oci://r.example.org/sylva/dib", PublicKey: "k1"},
		{Registry: "other", URL: "oci://r.example.org/other/", PublicKey: "k2"},
	}}
	for _, tc := range []struct {
		regKey, uri string
		want        []string
	}{
		{"sylva", "oci://r.example.org/sylva/dib/img:1", []string{"sylva"}},
		{"", "oci://r.example.org/sylva/dib/img:1", []string{"sylva"}},
		{"", "oci://r.example.org/sylva/dibs/img:1", nil}, // a longer path is not under it
		{"", "oci://r.example.org/sylva/dib-evil/img:1", nil},
		{"", "oci://R.Example.org:443/sylva/dib/img:1", []string{"sylva"}},
		{"", "oci://r.example.org/sylva/dib/../../other/img:1", nil}, // oci.Under's table has the rest
		{"other", "oci://r.example.org/sylva/dib/img:1", []string{"sylva", "other"}},
		{"", "oci://r.example.org/other/img:1", []string{"other"}},
		{"sylva", "https://files.example.org/img.raw", nil},
	} {
		var got []string
		for _, k := range tr.KeysFor(tc.regKey, tc.uri) {
			got = append(got, k.Registry)
		}
		if strings.Join(got, ",") != strings.Join(tc.want, ",") {
			t.Errorf("KeysFor(%q, %q) = %v, want %v", tc.regKey, tc.uri, got, tc.want)
		}
	}
	tr.Skip = true
	if got := tr.KeysFor("sylva", "oci://r.example.org/sylva/dib/img:1"); got != nil {
		t.Errorf("skipped: %v", got)
	}
}

// refuser refuses every signature, as a registry holding none would.
type refuser struct{ calls int }

func (r *refuser) Verify(_ context.Context, uri string, d digest.Digest, _ *signature.PublicKey) error {
	r.calls++
	return &signature.Error{URI: uri, Digest: d, Reason: signature.ErrNoSignature, Detail: "none"}
}

// Keys.Check is the one verification loop of the catalog and the image
// server: a refusal names the key and the caller's advice, a missing
// verifier fails closed, and a key that does not parse is named by path.
func TestKeysCheck(t *testing.T) {
	s := testenv.Signer(t)
	key, err := signature.NewKey("sylva", "oci://r.example.org/sylva", s.PublicKeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	d := digest.FromString("manifest")
	uri := "oci://r.example.org/sylva/img:1"
	v := &refuser{}
	err = signature.Keys{key}.Verify(context.Background(), v, uri, d, "; the advice")
	if !errors.Is(err, signature.ErrNoSignature) || v.calls != 1 ||
		!strings.HasSuffix(err.Error(), "(key from os_images_oci_registries.sylva.cosign_publickey; the advice)") {
		t.Errorf("refusal: %v", err)
	}
	if err := (signature.Keys{key}).Verify(context.Background(), nil, uri, d, ""); err == nil || !strings.HasPrefix(err.Error(), "Invalid signature for "+uri) {
		t.Errorf("no verifier: %v", err)
	}
	bad := signature.Keys{{Registry: "other", PublicKey: "not a key"}}
	if err := bad.Verify(context.Background(), v, uri, d, ""); err == nil || !strings.HasPrefix(err.Error(), "os_images_oci_registries.other.cosign_publickey: not a PEM public key") {
		t.Errorf("bad key: %v", err)
	}
	if err := (signature.Keys{}).Verify(context.Background(), nil, uri, d, ""); err != nil {
		t.Errorf("no key applies: %v", err)
	}
	if _, err := signature.NewKey("x", "", "garbage"); err == nil {
		t.Error("NewKey accepted garbage")
	}
}
