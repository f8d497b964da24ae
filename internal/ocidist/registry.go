// Package ocidist serves the image server's verified images through the
// read-only part of the OCI distribution API, for clients that take
// oci:// image URLs (Metal3's BareMetalOperator and Ironic's OCI image
// service): /v2/, and in each image's repository (images/<sha256>, as its
// image URL is /images/<sha256>/<filename>) its manifest by digest or by
// tag (its keys), an index per disk type (the tags raw and qcow2), its
// blob by digest (with ranges), and its tag list. What a manifest and an
// index hold is an identity rule of internal/osimage (OCIManifest,
// OCIIndex), which render applies too.
package ocidist

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/sylva-projects/osimages/internal/osimage"
)

// Image is what the registry needs of one image the server serves.
type Image struct {
	SHA256 osimage.SHA256
	// Ready says that this server holds it verified: only then are its
	// manifest and its blob reachable.
	Ready bool
	// Size is the verified file's length, when Ready; else the length the
	// catalog declares (0 when it declares none).
	Size int64
	// Filename is a name it is served under, for a peer's image URL.
	Filename string
	// Tags are the image keys it answers to as tags (the selected ones).
	Tags []string
	// Failure is why the last download failed, when it did and the
	// image is not Ready; Refused says that its bytes did not verify, so
	// they are not served. RetryAt is when the next download starts, zero
	// when none is scheduled.
	Failure string
	Refused bool
	RetryAt time.Time
}

// Images is what the registry asks of the image server.
type Images interface {
	// Image tells what is served of sum; ok is false when it is not
	// served.
	Image(sum osimage.SHA256) (img Image, ok bool)
}

// Registry is the read-only distribution API over Images. Blobs are sent
// by ServeBlob, the image server's own sender of verified files (ranges,
// ETag, a file found tampered with).
type Registry struct {
	Images    Images
	ServeBlob func(w http.ResponseWriter, r *http.Request, sum osimage.SHA256)
	// Peers, when set, answer for an image this replica does not hold
	// verified yet from a peer's verified copy, as its image URL does
	// (replica.Relay): a replica still filling never fails a client.
	Peers Peers
	// RetryAfterSeconds is what a client is told to wait for an image
	// that is served but not held verified yet.
	RetryAfterSeconds int
	// Hold, when set, holds a request for an image served but held
	// verified by no replica yet, as its image URL is held
	// (imagehttp.Endpoints.HoldFor): until one holds it, it is no longer
	// served, or the hold ends. Ironic's agent ignores Retry-After and
	// gives up on an oci:// image after 10 tries 10 s apart: a 503 at once
	// would fail a deploy that the image URL's hold lets through.
	Hold func(r *http.Request, sum osimage.SHA256)
	// Now is the clock of RetryAt (nil: time.Now).
	Now func() time.Time
}

// Handler serves /v2/ and everything under it. A GET pattern answers HEAD
// too; any other method is refused: the registry is read-only.
func (g Registry) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v2/{$}", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, "{}")
	})
	mux.HandleFunc("GET /v2/images/{sha256}/manifests/{reference}", g.image(g.serveManifest))
	mux.HandleFunc("GET /v2/images/{sha256}/blobs/{digest}", g.image(g.serveBlob))
	mux.HandleFunc("GET /v2/images/{sha256}/tags/list", g.image(g.serveTags))
	mux.HandleFunc("/v2/", func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			writeError(w, http.StatusMethodNotAllowed, "UNSUPPORTED", "this registry is read-only: it serves the verified images of the osimages server, and takes no upload or deletion")
			return
		}
		writeError(w, http.StatusNotFound, "NAME_UNKNOWN", "no such repository or endpoint: the osimages server answers repositories images/<sha256> of the images it serves (manifests, blobs and tags/list)")
	})
	return apiVersion(mux)
}

// apiVersion sets the header by which registry clients recognise the API.
func apiVersion(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Docker-Distribution-API-Version", "registry/2.0")
		h.ServeHTTP(w, r)
	})
}

// image finds the image of the request's repository, images/<sha256>, and
// answers NAME_UNKNOWN when it is not one served here.
func (g Registry) image(serve func(http.ResponseWriter, *http.Request, Image)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		sum, err := osimage.ParseSHA256(r.PathValue("sha256"))
		if err != nil {
			writeError(w, http.StatusNotFound, "NAME_UNKNOWN", fmt.Sprintf("repository images/%s: not a sha256 (%v)", r.PathValue("sha256"), err))
			return
		}
		img, ok := g.Images.Image(sum)
		if !ok {
			writeError(w, http.StatusNotFound, "NAME_UNKNOWN", fmt.Sprintf("repository images/%s: no such image is served here", sum))
			return
		}
		serve(w, r, img)
	}
}

// Peers is what the registry asks of the other replicas.
type Peers interface {
	// Holds says whether a peer holds sum verified.
	Holds(sum osimage.SHA256) bool
	// Serve answers a GET or HEAD of the image sum, under name, with a
	// peer's verified copy; false, with nothing written, when no peer
	// could.
	Serve(w http.ResponseWriter, r *http.Request, sum osimage.SHA256, name string) bool
}

// tagGrammar is the grammar of a tag in the distribution spec.
const tagGrammar = `[a-zA-Z0-9_][a-zA-Z0-9._-]{0,127}`

// tagPattern is compiled at first use: every command pays for what a
// package builds at init.
var tagPattern = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile("^" + tagGrammar + "$") })

// ValidTag says whether key can be a tag: image keys that cannot are
// reachable by digest only.
func ValidTag(key string) bool { return tagPattern().MatchString(key) }

func (g Registry) serveManifest(w http.ResponseWriter, r *http.Request, img Image) {
	ref := r.PathValue("reference")
	d, err := digest.Parse(ref)
	switch {
	case err == nil:
	// A disk type's tag wins over an image key of the same name: both
	// lead to the one manifest of the image.
	case slices.Contains(osimage.OCIDiskTypes, ref):
	case ValidTag(ref) && slices.Contains(img.Tags, ref):
	case ValidTag(ref):
		writeError(w, http.StatusNotFound, "MANIFEST_UNKNOWN", fmt.Sprintf("tag %q: neither a disk type (%s) nor a selected image key of this name gives image %s", ref, strings.Join(osimage.OCIDiskTypes, ", "), img.SHA256))
		return
	default:
		writeError(w, http.StatusBadRequest, "MANIFEST_INVALID", fmt.Sprintf("manifest reference %q is neither a digest (sha256:<64 hex digits>) nor a tag (%s)", ref, tagGrammar))
		return
	}
	img, ok := g.held(w, r, img)
	if !ok {
		return
	}
	// A peer's verified copy has the declared size: it was verified
	// against it.
	if !img.Ready && (g.Peers == nil || img.Size <= 0 || !g.Peers.Holds(img.SHA256)) {
		g.notReady(w, "MANIFEST_UNKNOWN", img)
		return
	}
	if err != nil {
		d = "" // a tag
	}
	mediaType, body, want := manifestFor(img, ref, d)
	if body == nil {
		writeError(w, http.StatusNotFound, "MANIFEST_UNKNOWN", fmt.Sprintf("image %s has manifest %s (and an index per disk type, tags %s), not %s", img.SHA256, want, strings.Join(osimage.OCIDiskTypes, ", "), d))
		return
	}
	w.Header().Set("Content-Type", mediaType)
	w.Header().Set("Docker-Content-Digest", want.String())
	w.Header().Set("ETag", `"`+want.String()+`"`)
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	if r.Method != http.MethodHead {
		_, _ = w.Write(body)
	}
}

// manifestFor is what ref names in the repository of img: the index of a
// disk type's tag (or digest), else the image's manifest (a key's tag, or
// its digest); nil, with the manifest's digest, for another digest d.
func manifestFor(img Image, ref string, d digest.Digest) (mediaType string, body []byte, dgst digest.Digest) {
	for _, diskType := range osimage.OCIDiskTypes {
		if b, id := osimage.OCIIndex(img.SHA256, img.Size, diskType); ref == diskType || d == id {
			return ocispec.MediaTypeImageIndex, b, id
		}
	}
	b, md := osimage.OCIManifest(img.SHA256, img.Size)
	if d != "" && d != md {
		return "", nil, md
	}
	return ocispec.MediaTypeImageManifest, b, md
}

func (g Registry) serveBlob(w http.ResponseWriter, r *http.Request, img Image) {
	d, err := digest.Parse(r.PathValue("digest"))
	switch {
	case err != nil:
		writeError(w, http.StatusBadRequest, "DIGEST_INVALID", fmt.Sprintf("blob %q: %v: give sha256:<64 hex digits>", r.PathValue("digest"), err))
	case d == ocispec.DescriptorEmptyJSON.Digest:
		body := ocispec.DescriptorEmptyJSON.Data
		w.Header().Set("Content-Type", ocispec.MediaTypeEmptyJSON)
		w.Header().Set("Docker-Content-Digest", d.String())
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		if r.Method != http.MethodHead {
			_, _ = w.Write(body)
		}
	case d != osimage.OCILayerDigest(img.SHA256):
		writeError(w, http.StatusNotFound, "BLOB_UNKNOWN", fmt.Sprintf("blob %s is not in repository images/%s: its one layer is %s", d, img.SHA256, osimage.OCILayerDigest(img.SHA256)))
	default:
		if img, ok := g.held(w, r, img); ok {
			g.serveLayer(w, r, img, d)
		}
	}
}

// serveLayer sends the layer d of img: the verified file, here or a
// peer's, else 503.
func (g Registry) serveLayer(w http.ResponseWriter, r *http.Request, img Image, d digest.Digest) {
	switch {
	case !img.Ready:
		w.Header().Set("Docker-Content-Digest", d.String())
		if g.Peers != nil && img.Filename != "" && g.Peers.Serve(w, r, img.SHA256, img.Filename) {
			return
		}
		w.Header().Del("Docker-Content-Digest")
		g.notReady(w, "BLOB_UNKNOWN", img)
	default:
		w.Header().Set("Docker-Content-Digest", d.String())
		g.ServeBlob(w, r, img.SHA256)
	}
}

// held holds a request for img while no replica holds it verified
// (Hold), then tells what is served of it now; ok is false when there is
// nothing more to answer: its client left, or the image is no longer
// served (answered 404 here).
func (g Registry) held(w http.ResponseWriter, r *http.Request, img Image) (Image, bool) {
	if img.Ready || g.Hold == nil {
		return img, true
	}
	g.Hold(r, img.SHA256)
	if r.Context().Err() != nil {
		return img, false
	}
	now, ok := g.Images.Image(img.SHA256)
	if !ok {
		writeError(w, http.StatusNotFound, "NAME_UNKNOWN", fmt.Sprintf("repository images/%s: the image is no longer served here", img.SHA256))
	}
	return now, ok
}

// notReady answers for an image served but not held verified yet: wait,
// or, when its download failed, as its image URL answers: 502 when its
// bytes did not verify, which waiting does not mend, and Retry-After only
// when a new download is scheduled.
func (g Registry) notReady(w http.ResponseWriter, code string, img Image) {
	if img.Failure == "" {
		w.Header().Set("Retry-After", strconv.Itoa(max(g.RetryAfterSeconds, 1)))
		writeError(w, http.StatusServiceUnavailable, code, fmt.Sprintf("image %s is served but not held verified here yet", img.SHA256))
		return
	}
	status, msg := http.StatusServiceUnavailable, fmt.Sprintf("image %s is not held verified here: its last download failed: %s", img.SHA256, img.Failure)
	if img.Refused {
		status, msg = http.StatusBadGateway, fmt.Sprintf("image %s is not served: what its source gave did not verify (%s), and what did not verify is never served", img.SHA256, img.Failure)
	}
	now := time.Now
	if g.Now != nil {
		now = g.Now
	}
	if img.RetryAt.IsZero() {
		msg += "; no new download is scheduled: the image is no longer selected"
	} else {
		wait := max(int(math.Ceil(img.RetryAt.Sub(now()).Seconds())), 1)
		w.Header().Set("Retry-After", strconv.Itoa(wait))
		msg += fmt.Sprintf("; a new download is scheduled in %d s", wait)
	}
	writeError(w, status, code, msg)
}

// tagList is the body of tags/list.
type tagList struct {
	Name string   `json:"name"`
	Tags []string `json:"tags"`
}

// serveTags lists the repository's tags, sorted, n at a time after last
// when asked (the spec's pagination, with a Link to the next page).
func (g Registry) serveTags(w http.ResponseWriter, r *http.Request, img Image) {
	tags := slices.Sorted(slices.Values(append(slices.Clone(osimage.OCIDiskTypes), img.Tags...)))
	tags = slices.Compact(tags)
	q := r.URL.Query()
	if last := q.Get("last"); last != "" {
		i, _ := slices.BinarySearch(tags, last)
		for i < len(tags) && tags[i] <= last {
			i++
		}
		tags = tags[i:]
	}
	repo := osimage.OCIRepository(img.SHA256)
	if ns := q.Get("n"); ns != "" {
		n, err := strconv.Atoi(ns)
		if err != nil || n < 0 {
			writeError(w, http.StatusBadRequest, "UNSUPPORTED", fmt.Sprintf("n=%q: give a count of tags, 0 or more", ns))
			return
		}
		if n < len(tags) {
			tags = tags[:n]
			if n > 0 {
				next := url.Values{"n": {ns}, "last": {tags[n-1]}}
				w.Header().Set("Link", fmt.Sprintf(`</v2/%s/tags/list?%s>; rel="next"`, repo, next.Encode()))
			}
		}
	}
	if tags == nil {
		tags = []string{}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(tagList{Name: repo, Tags: tags})
}

// registryError is one error of the spec's error body.
type registryError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func writeError(w http.ResponseWriter, status int, code, message string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(struct {
		Errors []registryError `json:"errors"`
	}{[]registryError{{Code: code, Message: message}}})
}
