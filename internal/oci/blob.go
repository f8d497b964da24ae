package oci

import (
	"context"
	"fmt"
	"io"
	"net/http"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/registry"
	"oras.land/oras-go/v2/registry/remote"
	"oras.land/oras-go/v2/registry/remote/auth"
)

// BlobURL is the registry API URL of blob d of ref's repository, with the
// scheme this client would use for it now.
func (c *Client) BlobURL(ref registry.Reference, d digest.Digest) string {
	_, plain := c.plainHTTP.Load(ref.Registry)
	return blobURL(plain, ref, d)
}

func blobURL(plain bool, ref registry.Reference, d digest.Digest) string {
	scheme := "https"
	if plain {
		scheme = "http"
	}
	return fmt.Sprintf("%s://%s/v2/%s/blobs/%s", scheme, ref.Host(), ref.Repository, d)
}

// GetBlob sends one GET for blob d of ref's repository with header (a Range,
// typically) through the shared client: credentials and token with the
// repository's pull scope, TLS settings, proxy, and the plain-HTTP fallback
// of an insecure setup. Redirects (to a CDN, say) are followed afresh on
// every call. The caller owns the response, whatever its status.
//
// oras-go's blob reader is not used for this: it resumes with open-ended
// ranges (bytes=N-), which some registries refuse, and accepts responses a
// resumable download must reject.
func (c *Client) GetBlob(ctx context.Context, ref registry.Reference, d digest.Digest, header http.Header) (*http.Response, error) {
	if err := d.Validate(); err != nil {
		return nil, fmt.Errorf("blob digest %q: %w", d, err)
	}
	ctx = auth.AppendRepositoryScope(ctx, ref, auth.ActionPull)
	get := func(plain bool) (*http.Response, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, blobURL(plain, ref, d), nil)
		if err != nil {
			return nil, err
		}
		for k, v := range header {
			req.Header[k] = v
		}
		return c.auth.Do(req)
	}
	_, plain := c.plainHTTP.Load(ref.Registry)
	resp, err := get(plain)
	if err != nil && c.insecure && !plain && isHTTPResponseToHTTPS(err) {
		c.plainHTTP.Store(ref.Registry, true)
		resp, err = get(true)
	}
	return resp, err
}

// HTTPClient is the client for plain HTTP(S) downloads: the registry
// transport's CA, TLS verification, proxy and retries, without registry
// credentials.
func (c *Client) HTTPClient() *http.Client { return c.http }

// UserAgent is the User-Agent this client sends.
func (c *Client) UserAgent() string { return c.userAgent }

// ReadBlob reads the small blob desc of ref's repository whole, checked
// against the descriptor's digest and size. A descriptor announcing more than
// limit bytes is refused before any request, so that a hostile manifest
// cannot make the caller read a large blob into memory.
func (c *Client) ReadBlob(ctx context.Context, ref registry.Reference, desc ocispec.Descriptor, limit int64) ([]byte, error) {
	if err := desc.Digest.Validate(); err != nil {
		return nil, fmt.Errorf("blob digest %q: %w", desc.Digest, err)
	}
	if desc.Size < 0 || desc.Size > limit {
		return nil, fmt.Errorf("blob %s is announced as %d bytes, more than the %d allowed", desc.Digest, desc.Size, limit)
	}
	var data []byte
	err := c.Do(ctx, ref, func(repo *remote.Repository) error {
		rc, err := repo.Blobs().Fetch(ctx, desc)
		if err != nil {
			return err
		}
		defer rc.Close()
		data, err = content.ReadAll(io.LimitReader(rc, limit+1), desc)
		return err
	})
	return data, err
}
