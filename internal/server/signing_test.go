package server

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sylva-projects/osimages/internal/catalog"
	"github.com/sylva-projects/osimages/internal/devregistry"
	"github.com/sylva-projects/osimages/internal/fill"
	"github.com/sylva-projects/osimages/internal/oci"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/pull"
	"github.com/sylva-projects/osimages/internal/servedset"
	"github.com/sylva-projects/osimages/internal/signature"
	"github.com/sylva-projects/osimages/internal/testenv"
	"github.com/sylva-projects/osimages/internal/values"
)

// blobLog records the blob GETs a registry answers, to prove that a refused
// image never had a byte of its layer downloaded.
type blobLog struct {
	mu    sync.Mutex
	paths []string
}

func (l *blobLog) middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/blobs/") {
			l.mu.Lock()
			l.paths = append(l.paths, r.URL.Path)
			l.mu.Unlock()
		}
		next.ServeHTTP(w, r)
	})
}

func (l *blobLog) fetched(layer string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, p := range l.paths {
		if strings.HasSuffix(p, "/blobs/"+layer) {
			return true
		}
	}
	return false
}

type signedSetup struct {
	reg    *devregistry.Registry
	blobs  *blobLog
	ours   *devregistry.Signer
	puller *pull.Puller
}

func newSignedSetup(t *testing.T) signedSetup {
	t.Helper()
	blobs := &blobLog{}
	reg := testenv.Registry(t, devregistry.Options{Middleware: blobs.middleware})
	client, err := oci.NewClient(oci.Options{Insecure: true})
	if err != nil {
		t.Fatal(err)
	}
	ours, err := devregistry.NewSigner()
	if err != nil {
		t.Fatal(err)
	}
	return signedSetup{reg: reg, blobs: blobs, ours: ours, puller: &pull.Puller{OCI: client}}
}

// publish pushes an image under dib/<key>:1.0 and returns its record as the
// catalog would write it (fields, uri, registry key, manifest digest).
func (s signedSetup) publish(t *testing.T, key string, seed uint64) (servedset.Wanted, devregistry.Published) {
	t.Helper()
	p, err := s.reg.Publish(context.Background(), devregistry.DiskImage{
		Repository: "dib/" + key, Tag: "1.0", Gzip: true, Content: devregistry.DiskContent(256<<10, seed),
	})
	if err != nil {
		t.Fatal(err)
	}
	img := p.Fields.Clone()
	img[osimage.FieldURI] = "oci://" + p.Ref
	img[osimage.FieldRegistryKey] = "sylva"
	img[osimage.FieldManifestDigest] = p.ManifestDigest.String()
	sha, err := img.SHA256()
	if err != nil {
		t.Fatal(err)
	}
	return servedset.Wanted{SHA256: sha, Key: key, Desc: img.Descriptor(), SelectedBy: []string{"test"}}, p
}

// trust reads the management values' signature policy: the sylva registry
// holds dib/ with our key.
func (s signedSetup) trust(t *testing.T, extra string) func() (signature.Policy, error) {
	t.Helper()
	doc := fmt.Sprintf("os_images_oci_registries:\n  sylva:\n    url: oci://%s/dib\n    tag: \"1.0\"\n    cosign_publickey: |\n      %s\n%s",
		s.reg.Host, strings.ReplaceAll(strings.TrimSpace(s.ours.PublicKeyPEM), "\n", "\n      "), extra)
	v, err := values.Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	tr, err := catalog.PolicyFromValues(v)
	if err != nil {
		t.Fatal(err)
	}
	return func() (signature.Policy, error) { return tr, nil }
}

func (s signedSetup) start(t *testing.T, trust func() (signature.Policy, error)) *harness {
	t.Helper()
	return start(t, t.TempDir(), newFakeSource(), func(c *Config) {
		c.Pull = fill.PullWith(func() *pull.Puller { return s.puller }, trust)
		// A refused image is not retried during the test.
		c.RetryBase, c.RetryMax = 1<<40, 1<<40
	})
}

func reasonOf(h *harness, sum osimage.SHA256) string {
	statuses, _ := h.srv.Statuses()
	for _, st := range statuses {
		if st.SHA256 == sum {
			return st.Reason
		}
	}
	return ""
}

func TestServerVerifiesSignaturesBeforeDownloading(t *testing.T) {
	s := newSignedSetup(t)
	theirs, err := devregistry.NewSigner()
	if err != nil {
		t.Fatal(err)
	}
	valid, validP := s.publish(t, "valid", 1)
	testenv.Sign(t, s.reg, s.ours, validP, devregistry.SignOptions{})
	otherKey, otherKeyP := s.publish(t, "other-key", 2)
	testenv.Sign(t, s.reg, theirs, otherKeyP, devregistry.SignOptions{})
	otherDigest, otherDigestP := s.publish(t, "other-digest", 3)
	testenv.Sign(t, s.reg, s.ours, otherDigestP, devregistry.SignOptions{PayloadDigest: validP.ManifestDigest})
	unsigned, unsignedP := s.publish(t, "unsigned", 4)
	// A record that lost its registry key is still checked: its URI is
	// under the sylva registry's url.
	anonymous, anonymousP := s.publish(t, "anonymous", 5)
	anonymous.Desc.RegistryKey = ""

	h := s.start(t, s.trust(t, ""))
	h.want(valid, otherKey, otherDigest, unsigned, anonymous)
	h.waitPhase(valid.SHA256, PhaseReady)
	if resp, body := h.get(imageURL(valid)); resp.StatusCode != http.StatusOK || len(body) != 256<<10 {
		t.Errorf("valid image: %d, %d bytes", resp.StatusCode, len(body))
	}

	for _, tc := range []struct {
		w    servedset.Wanted
		p    devregistry.Published
		want string
	}{
		{otherKey, otherKeyP, "signed by another key"},
		{otherDigest, otherDigestP, "the signed payload names another manifest digest"},
		{unsigned, unsignedP, "no signature found"},
		{anonymous, anonymousP, "no signature found"},
	} {
		h.waitPhase(tc.w.SHA256, PhaseFailed)
		reason := reasonOf(h, tc.w.SHA256)
		for _, want := range []string{"Invalid signature for " + tc.w.Desc.URI + ": " + tc.want, "os_images_oci_registries.sylva.cosign_publickey", "nothing was downloaded"} {
			if !strings.Contains(reason, want) {
				t.Errorf("%s: reason lacks %q: %s", tc.w.Key, want, reason)
			}
		}
		if s.blobs.fetched(tc.p.LayerDigest.String()) {
			t.Errorf("%s: the layer of a refused image was downloaded", tc.w.Key)
		}
		if resp, _ := h.get(imageURL(tc.w)); resp.StatusCode != http.StatusBadGateway { // refused, not pending
			t.Errorf("%s: served with %d", tc.w.Key, resp.StatusCode)
		}
		if _, ok := h.store.Get(tc.w.SHA256); ok {
			t.Errorf("%s: stored", tc.w.Key)
		}
	}
	served := h.waitOutput("has the refused images unavailable", func(set osimage.ServedSet) bool {
		return set[valid.SHA256].Available && len(set) == 5 && !set[unsigned.SHA256].Available
	})
	if n := countAvailable(served); n != 1 {
		t.Errorf("%d images available, want 1", n)
	}
	if got := testutil.ToFloat64(h.srv.cfg.Metrics.VerifyFailures); got != 4 {
		t.Errorf("osimages_verification_failures_total = %v, want 4", got)
	}
	var page bytes.Buffer
	_, body := h.get("/")
	page.Write(body)
	if !strings.Contains(page.String(), "Invalid signature for") {
		t.Error("the status page does not show the refusal")
	}
}

func TestServerRefusesAMovedTag(t *testing.T) {
	s := newSignedSetup(t)
	w, p := s.publish(t, "moving", 1)
	testenv.Sign(t, s.reg, s.ours, p, devregistry.SignOptions{})
	// After the catalog ran, the tag is moved to other content, validly
	// signed: only the pin can tell.
	_, moved := s.publish(t, "moving", 2)
	testenv.Sign(t, s.reg, s.ours, moved, devregistry.SignOptions{})

	h := s.start(t, s.trust(t, ""))
	h.want(w)
	h.waitPhase(w.SHA256, PhaseFailed)
	reason := reasonOf(h, w.SHA256)
	for _, want := range []string{"manifest digest mismatch: expected " + p.ManifestDigest.String() + ", got " + moved.ManifestDigest.String(), "run the catalog again"} {
		if !strings.Contains(reason, want) {
			t.Errorf("reason lacks %q: %s", want, reason)
		}
	}
	if s.blobs.fetched(moved.LayerDigest.String()) || s.blobs.fetched(p.LayerDigest.String()) {
		t.Error("a layer was downloaded for a moved tag")
	}
	if got := testutil.ToFloat64(h.srv.cfg.Metrics.VerifyFailures); got != 1 {
		t.Errorf("osimages_verification_failures_total = %v, want 1", got)
	}

	// The record of the new catalog pins the new manifest: it is served.
	fresh := w
	fresh.Desc = moved.Fields.Descriptor()
	fresh.Desc.URI, fresh.Desc.RegistryKey, fresh.Desc.ManifestDigest = w.Desc.URI, w.Desc.RegistryKey, moved.ManifestDigest
	sha, err := moved.Fields.SHA256()
	if err != nil {
		t.Fatal(err)
	}
	fresh.SHA256 = sha
	h.want(fresh)
	h.waitPhase(fresh.SHA256, PhaseReady)
}

func TestServerSkipSigningCheck(t *testing.T) {
	s := newSignedSetup(t)
	w, p := s.publish(t, "unsigned", 1)
	h := s.start(t, s.trust(t, "security: {os_images: {skip_signing_check: true}}\n"))
	h.want(w)
	h.waitPhase(w.SHA256, PhaseReady)
	if !s.blobs.fetched(p.LayerDigest.String()) {
		t.Error("the layer was not downloaded")
	}
}

func TestServerFailsClosedWithoutTrust(t *testing.T) {
	s := newSignedSetup(t)
	w, p := s.publish(t, "image", 1)
	testenv.Sign(t, s.reg, s.ours, p, devregistry.SignOptions{})
	broken := func() (signature.Policy, error) {
		return signature.Policy{}, fmt.Errorf("os_images_oci_registries.sylva.cosign_publickey: not a PEM public key")
	}
	h := s.start(t, broken)
	h.want(w)
	h.waitPhase(w.SHA256, PhaseFailed)
	if reason := reasonOf(h, w.SHA256); !strings.Contains(reason, "cannot be read from the management values") {
		t.Errorf("reason: %s", reason)
	}
	if s.blobs.fetched(p.LayerDigest.String()) {
		t.Error("pulled without a readable signature policy")
	}
}
