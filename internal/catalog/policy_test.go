package catalog

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/opencontainers/go-digest"
	"github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2"

	"github.com/sylva-projects/osimages/internal/devregistry"
	"github.com/sylva-projects/osimages/internal/oci"
	"github.com/sylva-projects/osimages/internal/testenv"
)

// A hand-declared image that names a keyed registry through another
// spelling of its host is that registry's image: its key applies. Keys
// were matched by string prefix, and such images were published unchecked.
func TestResolveChecksOtherSpellingsOfAKeyedRegistry(t *testing.T) {
	reg := testenv.Registry(t, devregistry.Options{})
	published := publish(t, reg, 1)
	ours := testenv.Signer(t)
	port := reg.Host[strings.LastIndexByte(reg.Host, ':')+1:]
	path := "/" + published["img-00"].Repository + ":0.7.6"
	spellings := map[string]string{
		"via-localhost": "oci://localhost:" + port + path,
		"via-upper":     "oci://LOCALHOST:" + port + path,
		"via-mapped":    "oci://[::ffff:127.0.0.1]:" + port + path,
		"via-v6":        "oci://[::1]:" + port + path,
		"via-short":     "oci://127.1:" + port + path,
	}
	var extra strings.Builder
	extra.WriteString("os_images:\n")
	for key, uri := range spellings {
		fmt.Fprintf(&extra, "  %s: {uri: %q}\n", key, uri)
	}
	v := signedValues(t, reg, ours.PublicKeyPEM, extra.String())
	plan, err := PlanFromValues(v, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, src := range plan.Sources {
		if len(src.SigningKeys) != 1 || src.SigningKeys[0].Registry != "sylva" {
			t.Errorf("%s (%s): keys %v, want the sylva registry's", src.Key, src.URI, src.SigningKeys)
		}
	}
	if u := plan.Unchecked(); len(u) != 0 {
		t.Errorf("unchecked: %v", u)
	}
	// And resolving refuses the unsigned artifact through another spelling
	// of 127.0.0.1 that needs no resolver (localhost would ask one).
	_, err = resolveValues(t, signedValues(t, reg, ours.PublicKeyPEM, fmt.Sprintf("os_images:\n  via-mapped: {uri: %q}\n", spellings["via-mapped"])), oci.Options{})
	if f := failuresByKey(t, err)["via-mapped"]; !strings.Contains(f.Cause, "no signature found") {
		t.Errorf("via-mapped: %v", err)
	}
}

// manifestLog counts the manifest requests a registry answers.
type manifestLog struct {
	mu    sync.Mutex
	paths []string
}

func (l *manifestLog) middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if (r.Method == http.MethodGet || r.Method == http.MethodHead) && strings.Contains(r.URL.Path, "/manifests/") {
			l.mu.Lock()
			l.paths = append(l.paths, r.URL.Path)
			l.mu.Unlock()
		}
		next.ServeHTTP(w, r)
	})
}

func (l *manifestLog) reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.paths = nil
}

func (l *manifestLog) asked(repo string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, p := range l.paths {
		if strings.Contains(p, "/"+repo+"/manifests/") {
			return true
		}
	}
	return false
}

func TestResolveRequireSignatures(t *testing.T) {
	log := &manifestLog{}
	reg := testenv.Registry(t, devregistry.Options{Middleware: log.middleware})
	published := publish(t, reg, 1)
	ours := testenv.Signer(t)
	testenv.Sign(t, reg, ours, published["img-00"], devregistry.SignOptions{})
	plain, err := reg.Publish(context.Background(), devregistry.DiskImage{Repository: "plain/img-plain", Tag: "0.7.6", Content: []byte("unsigned")})
	if err != nil {
		t.Fatal(err)
	}
	extra := fmt.Sprintf("os_images:\n  img-plain: {uri: \"oci://%s\"}\n  http-image: {uri: \"https://files.example.org/x.raw\", sha256: %s}\n",
		plain.Ref, strings.Repeat("a", 64))
	require := "security: {os_images: {require_signatures: true}}\n"
	v := signedValues(t, reg, ours.PublicKeyPEM, extra+require, "img-00")

	plan, err := PlanFromValues(v, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !plan.RequireSignatures || strings.Join(plan.Unchecked(), ",") != "img-plain" {
		t.Errorf("plan: require %v, unchecked %v", plan.RequireSignatures, plan.Unchecked())
	}
	log.reset()
	without, _ := PlanFromValues(signedValues(t, reg, ours.PublicKeyPEM, extra, "img-00"), nil)
	if without.InputsHash() == plan.InputsHash() {
		t.Error("require_signatures does not change the inputs hash")
	}

	_, err = resolveValues(t, v, oci.Options{})
	failures := failuresByKey(t, err)
	if len(failures) != 1 {
		t.Errorf("failures: %v", failures)
	}
	f := failuresByKey(t, err)["img-plain"]
	for _, want := range []string{"Invalid signature for oci://" + plain.Ref, "no cosign_publickey", "security.os_images.require_signatures is true"} {
		if !strings.Contains(f.Cause, want) {
			t.Errorf("cause lacks %q: %s", want, f.Cause)
		}
	}
	if log.asked("plain/img-plain") {
		t.Error("the registry was asked for an image that no key could verify")
	}

	// Only the signed and the HTTP image: published.
	v = signedValues(t, reg, ours.PublicKeyPEM, fmt.Sprintf("os_images:\n  http-image: {uri: \"https://files.example.org/x.raw\", sha256: %s}\n", strings.Repeat("a", 64))+require, "img-00")
	if cat, err := resolveValues(t, v, oci.Options{}); err != nil || len(cat) != 2 {
		t.Errorf("signed images under require_signatures: %v %v", cat, err)
	}

	_, err = PlanFromValues(mustParse(t, "security: {os_images: {require_signatures: true, skip_signing_check: true}}\n"), nil)
	var inputErr *InputError
	if !errors.As(err, &inputErr) || !strings.Contains(err.Error(), "both true") {
		t.Errorf("require and skip together: %v", err)
	}
	if _, err := PlanFromValues(mustParse(t, "security: {os_images: {require_signatures: maybe}}\n"), nil); !errors.As(err, &inputErr) || !strings.Contains(err.Error(), RequirePath+": must be true or false") {
		t.Errorf("require not a boolean: %v", err)
	}
}

// The catalog refuses what the image server would refuse at download time:
// an index, and a manifest with other than one layer.
func TestResolveRefusesWhatTheServerWould(t *testing.T) {
	reg := testenv.Registry(t, devregistry.Options{})
	ctx := context.Background()
	good := publish(t, reg, 1)["img-00"]
	push := func(repoName string, layers int) {
		repo, err := reg.Repository(repoName)
		if err != nil {
			t.Fatal(err)
		}
		var descs []ocispec.Descriptor
		for i := range layers {
			data := []byte(fmt.Sprintf("layer %d", i))
			d := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageLayer, Digest: digest.FromBytes(data), Size: int64(len(data))}
			if err := repo.Push(ctx, d, bytes.NewReader(data)); err != nil {
				t.Fatal(err)
			}
			descs = append(descs, d)
		}
		m, err := oras.PackManifest(ctx, repo, oras.PackManifestVersion1_1, devregistry.ArtifactType, oras.PackManifestOptions{
			Layers: descs, ManifestAnnotations: map[string]string{"sylvaproject.org/diskimage/sha256": strings.Repeat("b", 64)},
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := repo.Tag(ctx, m, "0.7.6"); err != nil {
			t.Fatal(err)
		}
	}
	push(dibRepo+"two-layers", 2)
	// A manifest with no layer at all (oras would add the empty one).
	noLayer, err := reg.Repository(dibRepo + "no-layer")
	if err != nil {
		t.Fatal(err)
	}
	config := []byte("{}")
	configDesc := ocispec.Descriptor{MediaType: ocispec.MediaTypeEmptyJSON, Digest: digest.FromBytes(config), Size: 2}
	if err := noLayer.Push(ctx, configDesc, bytes.NewReader(config)); err != nil {
		t.Fatal(err)
	}
	bare, _ := json.Marshal(ocispec.Manifest{Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageManifest, Config: configDesc, Layers: []ocispec.Descriptor{},
		Annotations: map[string]string{"sylvaproject.org/diskimage/sha256": strings.Repeat("c", 64)}})
	bareDesc := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, Digest: digest.FromBytes(bare), Size: int64(len(bare))}
	if err := noLayer.PushReference(ctx, bareDesc, bytes.NewReader(bare), "0.7.6"); err != nil {
		t.Fatal(err)
	}

	// An index naming the good artifact, under a tag of its own.
	repo, err := reg.Repository(dibRepo + "an-index")
	if err != nil {
		t.Fatal(err)
	}
	goodRepo, err := reg.Repository(good.Repository)
	if err != nil {
		t.Fatal(err)
	}
	desc, err := oras.Copy(ctx, goodRepo, "0.7.6", repo, "inner", oras.DefaultCopyOptions)
	if err != nil {
		t.Fatal(err)
	}
	index, _ := json.Marshal(ocispec.Index{Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageIndex, Manifests: []ocispec.Descriptor{desc}})
	indexDesc := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageIndex, Digest: digest.FromBytes(index), Size: int64(len(index))}
	if err := repo.PushReference(ctx, indexDesc, bytes.NewReader(index), "0.7.6"); err != nil {
		t.Fatal(err)
	}

	_, err = resolveValues(t, dibValues(t, reg, true, "img-00", "two-layers", "no-layer", "an-index"), oci.Options{})
	failures := failuresByKey(t, err)
	for key, want := range map[string]string{
		"two-layers": "has 2 layers, an OS image artifact has exactly one",
		"no-layer":   "has 0 layers",
		"an-index":   "is an index (" + ocispec.MediaTypeImageIndex + ")",
	} {
		if f, ok := failures[key]; !ok || !strings.Contains(f.Cause, want) {
			t.Errorf("%s: want %q, got %+v", key, want, f)
		}
	}
	if _, ok := failures["img-00"]; ok || len(failures) != 3 {
		t.Errorf("failures: %v", failures)
	}
}
