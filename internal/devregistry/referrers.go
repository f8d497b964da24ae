package devregistry

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"

	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// ReferrersAPI gives the registry the OCI 1.1 referrers API
// (GET /v2/<name>/referrers/<digest>), which distribution lacks, paged the
// way registries that have it page (a Link header to the next page). It
// lists what the registry holds under the referrers tag schema (the index
// tagged sha256-<hex>, which oras-go and cosign maintain when the registry
// has no API), so pushing a referrer is unchanged. Give Middleware as
// Options.Middleware (or wrap another middleware with it).
type ReferrersAPI struct {
	// PageSize is the number of descriptors on a page; 0 means 10.
	PageSize int
	// Padding lists that many made-up referrers (manifests that do not
	// exist) before the true ones: a manifest with more referrers than a
	// client reads, or referrers deleted but still listed.
	Padding int
	// PaddingArtifactType is the artifact type of the made-up referrers;
	// empty means PaddingArtifactType.
	PaddingArtifactType string
	// EmptyPages answers that many empty pages, each linking to the next,
	// before the listing: a registry that pages for ever.
	EmptyPages int
}

// PaddingArtifactType is the artifact type of ReferrersAPI.Padding's
// made-up referrers.
const PaddingArtifactType = "application/vnd.osimages.test.padding"

// Middleware serves the referrers API in front of next.
func (a ReferrersAPI) Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		repo, subject, ok := parseReferrersPath(r.URL.Path)
		if !ok || r.Method != http.MethodGet {
			next.ServeHTTP(w, r)
			return
		}
		a.serve(w, r, next, repo, subject)
	})
}

func parseReferrersPath(p string) (string, digest.Digest, bool) {
	rest, ok := strings.CutPrefix(p, "/v2/")
	if !ok {
		return "", "", false
	}
	i := strings.LastIndex(rest, "/referrers/")
	if i <= 0 {
		return "", "", false
	}
	d, err := digest.Parse(rest[i+len("/referrers/"):])
	if err != nil {
		return "", "", false
	}
	return rest[:i], d, true
}

func (a ReferrersAPI) serve(w http.ResponseWriter, r *http.Request, next http.Handler, repo string, subject digest.Digest) {
	size := a.PageSize
	if size <= 0 {
		size = 10
	}
	// The position in the listing travels in the Link, as an opaque
	// cursor would; empty pages come first.
	at, _ := strconv.Atoi(r.URL.Query().Get("at"))
	var page []ocispec.Descriptor
	more := false
	if at < a.EmptyPages {
		more = true
	} else {
		all, err := a.listing(r, next, repo, subject)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		from := at - a.EmptyPages
		to := min(from+size, len(all))
		if from < to {
			page = all[from:to]
		}
		more = to < len(all)
		at = a.EmptyPages + to - 1
	}
	if more {
		w.Header().Set("Link", fmt.Sprintf(`<%s?at=%d>; rel="next"`, r.URL.Path, at+1))
	}
	body, err := json.Marshal(ocispec.Index{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: ocispec.MediaTypeImageIndex,
		Manifests: append([]ocispec.Descriptor{}, page...),
	})
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", ocispec.MediaTypeImageIndex)
	_, _ = w.Write(body)
}

// listing is the padding, then the referrers index the registry holds
// under the tag schema (none when there is no such tag).
func (a ReferrersAPI) listing(r *http.Request, next http.Handler, repo string, subject digest.Digest) ([]ocispec.Descriptor, error) {
	var all []ocispec.Descriptor
	padding := a.PaddingArtifactType
	if padding == "" {
		padding = PaddingArtifactType
	}
	for i := range a.Padding {
		all = append(all, ocispec.Descriptor{
			MediaType:    ocispec.MediaTypeImageManifest,
			ArtifactType: padding,
			Digest:       digest.FromString(fmt.Sprintf("padding %d of %s", i, subject)),
			Size:         512,
		})
	}
	req := httptest.NewRequestWithContext(r.Context(), http.MethodGet, "/v2/"+repo+"/manifests/"+subject.Algorithm().String()+"-"+subject.Encoded(), nil)
	req.Header = r.Header.Clone()
	req.Header.Set("Accept", ocispec.MediaTypeImageIndex)
	rec := httptest.NewRecorder()
	next.ServeHTTP(rec, req)
	switch rec.Code {
	case http.StatusOK:
	case http.StatusNotFound:
		return all, nil
	default:
		return nil, fmt.Errorf("reading the referrers index of %s@%s: %d %s", repo, subject, rec.Code, rec.Body.String())
	}
	var index ocispec.Index
	if err := json.Unmarshal(rec.Body.Bytes(), &index); err != nil {
		return nil, fmt.Errorf("the referrers index of %s@%s: %w", repo, subject, err)
	}
	return append(all, index.Manifests...), nil
}
