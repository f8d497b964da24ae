package ocidist

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"

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
	// Size is the verified file's length, when Ready.
	Size int64
	// DiskFormat is the catalog's image-format ("" when not given).
	DiskFormat string
	// Tags are the image keys it answers to as tags (the selected ones).
	Tags []string
}

// Images is what the registry asks of the image server.
type Images interface {
	// Served lists every image the server serves, held verified or not.
	Served() []Image
}

// Registry is the read-only distribution API over Images. Blobs are sent
// by ServeBlob, the image server's own sender of verified files (ranges,
// ETag, a file found tampered with).
type Registry struct {
	Images    Images
	ServeBlob func(w http.ResponseWriter, r *http.Request, sum osimage.SHA256)
	// RetryAfterSeconds is what a client is told to wait for an image
	// that is served but not held verified yet.
	RetryAfterSeconds int

	manifests *manifestCache
}

// Handler serves /v2/ and everything under it. A GET pattern answers HEAD
// too; any other method is refused: the registry is read-only.
func (g Registry) Handler() http.Handler {
	g.manifests = &manifestCache{}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v2/{$}", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, "{}")
	})
	repo := "/v2/" + Repository
	mux.HandleFunc("GET "+repo+"/manifests/{reference}", g.serveManifest)
	mux.HandleFunc("GET "+repo+"/blobs/{digest}", g.serveBlob)
	mux.HandleFunc("GET "+repo+"/tags/list", g.serveTags)
	mux.HandleFunc("/v2/", func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			writeError(w, http.StatusMethodNotAllowed, "UNSUPPORTED", "this registry is read-only: it serves the verified images of the osimages server, and takes no upload or deletion")
			return
		}
		writeError(w, http.StatusNotFound, "NAME_UNKNOWN", fmt.Sprintf("no such repository or endpoint: the osimages server answers repository %q only (manifests, blobs and tags/list)", Repository))
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

// tagPattern is the grammar of a tag in the distribution spec.
var tagPattern = regexp.MustCompile(`^[a-zA-Z0-9_][a-zA-Z0-9._-]{0,127}$`)

// ValidTag says whether key can be a tag: image keys that cannot are
// reachable by digest only.
func ValidTag(key string) bool { return tagPattern.MatchString(key) }

func (g Registry) serveManifest(w http.ResponseWriter, r *http.Request) {
	ref := r.PathValue("reference")
	served := g.Images.Served()
	var img *Image
	if strings.Contains(ref, ":") {
		d, err := digest.Parse(ref)
		if err != nil {
			writeError(w, http.StatusBadRequest, "DIGEST_INVALID", fmt.Sprintf("manifest reference %q is not a valid digest (%v): give sha256:<64 hex digits>, or an image key as tag", ref, err))
			return
		}
		for i := range served {
			if served[i].Ready && g.manifests.get(served[i]).digest == d {
				img = &served[i]
				break
			}
		}
		if img == nil {
			writeError(w, http.StatusNotFound, "MANIFEST_UNKNOWN", fmt.Sprintf("no image held verified here has manifest %s", d))
			return
		}
	} else {
		if !ValidTag(ref) {
			writeError(w, http.StatusNotFound, "MANIFEST_UNKNOWN", fmt.Sprintf("%q is not a tag (tags are [a-zA-Z0-9_][a-zA-Z0-9._-]{0,127})", ref))
			return
		}
		for i := range served {
			if slices.Contains(served[i].Tags, ref) {
				img = &served[i]
				break
			}
		}
		if img == nil {
			writeError(w, http.StatusNotFound, "MANIFEST_UNKNOWN", fmt.Sprintf("tag %q names no image selected here", ref))
			return
		}
		if !img.Ready {
			g.notReady(w, "MANIFEST_UNKNOWN", *img)
			return
		}
	}
	m := g.manifests.get(*img)
	w.Header().Set("Content-Type", ocispec.MediaTypeImageManifest)
	w.Header().Set("Docker-Content-Digest", m.digest.String())
	w.Header().Set("ETag", `"`+m.digest.String()+`"`)
	w.Header().Set("Content-Length", strconv.Itoa(len(m.body)))
	if r.Method != http.MethodHead {
		_, _ = w.Write(m.body)
	}
}

func (g Registry) serveBlob(w http.ResponseWriter, r *http.Request) {
	d, err := digest.Parse(r.PathValue("digest"))
	if err != nil {
		writeError(w, http.StatusBadRequest, "DIGEST_INVALID", fmt.Sprintf("blob %q: %v: give sha256:<64 hex digits>", r.PathValue("digest"), err))
		return
	}
	if d == ocispec.DescriptorEmptyJSON.Digest {
		body := ocispec.DescriptorEmptyJSON.Data
		w.Header().Set("Content-Type", ocispec.MediaTypeEmptyJSON)
		w.Header().Set("Docker-Content-Digest", d.String())
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		if r.Method != http.MethodHead {
			_, _ = w.Write(body)
		}
		return
	}
	if d.Algorithm() != digest.SHA256 {
		writeError(w, http.StatusNotFound, "BLOB_UNKNOWN", fmt.Sprintf("blob %s: the layers here are sha256 digests", d))
		return
	}
	sum := osimage.SHA256(d.Encoded())
	for _, img := range g.Images.Served() {
		if img.SHA256 != sum {
			continue
		}
		if !img.Ready {
			g.notReady(w, "BLOB_UNKNOWN", img)
			return
		}
		w.Header().Set("Docker-Content-Digest", d.String())
		g.ServeBlob(w, r, sum)
		return
	}
	writeError(w, http.StatusNotFound, "BLOB_UNKNOWN", fmt.Sprintf("blob %s is not an image served here", d))
}

// notReady answers for an image served but not held verified yet: wait.
func (g Registry) notReady(w http.ResponseWriter, code string, img Image) {
	w.Header().Set("Retry-After", strconv.Itoa(max(g.RetryAfterSeconds, 1)))
	writeError(w, http.StatusServiceUnavailable, code, fmt.Sprintf("image %s is selected but not held verified here yet", img.SHA256))
}

// tagList is the body of tags/list.
type tagList struct {
	Name string   `json:"name"`
	Tags []string `json:"tags"`
}

// serveTags lists the tags, sorted, n at a time after last when asked
// (the spec's pagination, with a Link to the next page).
func (g Registry) serveTags(w http.ResponseWriter, r *http.Request) {
	var tags []string
	for _, img := range g.Images.Served() {
		tags = append(tags, img.Tags...)
	}
	slices.Sort(tags)
	tags = slices.Compact(tags)
	q := r.URL.Query()
	if last := q.Get("last"); last != "" {
		i, _ := slices.BinarySearch(tags, last)
		for i < len(tags) && tags[i] <= last {
			i++
		}
		tags = tags[i:]
	}
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
				w.Header().Set("Link", fmt.Sprintf(`</v2/%s/tags/list?%s>; rel="next"`, Repository, next.Encode()))
			}
		}
	}
	if tags == nil {
		tags = []string{}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(tagList{Name: Repository, Tags: tags})
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

// manifestCache keeps the manifest of each image, so that a lookup by
// digest does not hash every served image's manifest again.
type manifestCache struct {
	mu sync.Mutex
	m  map[manifestKey]builtManifest
}

type manifestKey struct {
	sum    osimage.SHA256
	size   int64
	format string
}

type builtManifest struct {
	body   []byte
	digest digest.Digest
}

// maxCachedManifests bounds the cache: past it, it starts again empty.
const maxCachedManifests = 8192

func (c *manifestCache) get(img Image) builtManifest {
	k := manifestKey{img.SHA256, img.Size, img.DiskFormat}
	c.mu.Lock()
	defer c.mu.Unlock()
	if m, ok := c.m[k]; ok {
		return m
	}
	if c.m == nil || len(c.m) >= maxCachedManifests {
		c.m = map[manifestKey]builtManifest{}
	}
	body, d := Manifest(img.SHA256, img.Size, img.DiskFormat)
	c.m[k] = builtManifest{body, d}
	return c.m[k]
}
