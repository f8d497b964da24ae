package server

import (
	"context"
	"strings"
	"testing"

	"github.com/sylva-projects/osimages/internal/devregistry"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/servedset"
)

// A keyed registry reached through another spelling of its host is that
// registry: its key applies. Keys used to be matched by string prefix, so
// oci://localhost:PORT/... of a registry declared as 127.0.0.1:PORT was
// pulled with no signature lookup.
func TestServerChecksOtherSpellingsOfAKeyedRegistry(t *testing.T) {
	s := newSignedSetup(t)
	port := s.reg.Host[strings.LastIndexByte(s.reg.Host, ':')+1:]
	w, p := s.publish(t, "respelt", 1)
	w.Desc.RegistryKey = "" // hand-declared: no registry key
	w.Desc.URI = "oci://LocalHost:" + port + "/" + p.Repository + ":1.0"
	h := s.start(t, s.trust(t, ""))
	h.want(w)
	h.waitPhase(w.SHA256, PhaseFailed)
	if reason := reasonOf(h, w.SHA256); !strings.Contains(reason, "no signature found") || !strings.Contains(reason, "os_images_oci_registries.sylva.cosign_publickey") {
		t.Errorf("reason: %s", reason)
	}
	if s.blobs.fetched(p.LayerDigest.String()) {
		t.Error("the layer of an unsigned image of a keyed registry was downloaded")
	}
}

// require_signatures refuses an OCI image that no key applies to, before a
// request is made.
func TestServerRequireSignatures(t *testing.T) {
	s := newSignedSetup(t)
	p, err := s.reg.Publish(context.Background(), devregistry.DiskImage{Repository: "other/elsewhere", Tag: "1.0", Content: devregistry.DiskContent(4<<10, 1)})
	if err != nil {
		t.Fatal(err)
	}
	img := p.Fields.Clone()
	img[osimage.FieldURI] = "oci://" + p.Ref
	sha, err := img.SHA256()
	if err != nil {
		t.Fatal(err)
	}
	w := servedset.Wanted{SHA256: sha, Key: "elsewhere", Desc: img.Descriptor(), SelectedBy: []string{"test"}}
	h := s.start(t, s.trust(t, "security: {os_images: {require_signatures: true}}\n"))
	h.want(w)
	h.waitPhase(w.SHA256, PhaseFailed)
	reason := reasonOf(h, w.SHA256)
	for _, want := range []string{"Invalid signature for " + w.Desc.URI, "security.os_images.require_signatures is true", "nothing was downloaded"} {
		if !strings.Contains(reason, want) {
			t.Errorf("reason lacks %q: %s", want, reason)
		}
	}
	if s.blobs.fetched(p.LayerDigest.String()) {
		t.Error("downloaded")
	}
}
