package catalog

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"syscall"
	"time"

	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sync/errgroup"
	"oras.land/oras-go/v2/errdef"
	"oras.land/oras-go/v2/registry/remote/errcode"

	"github.com/sylva-projects/osimages/internal/oci"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/signature"
)

// ManifestFetcher reads an image's manifest from its registry.
type ManifestFetcher interface {
	FetchManifest(ctx context.Context, uri string) (oci.Manifest, error)
}

// SignatureVerifier checks that manifest d of uri's repository is signed
// with key; signature.Verifier is one.
type SignatureVerifier = signature.KeyVerifier

// ResolveOptions bound the work of Resolve.
type ResolveOptions struct {
	// Signatures verifies the images that have signing keys. Without it,
	// such an image fails: it is never published unverified.
	Signatures SignatureVerifier
	// Concurrency is the number of manifests fetched at once (default 8).
	Concurrency int
	// Timeout bounds the resolution of one image, retries included
	// (default 60s).
	Timeout time.Duration
}

// Resolve reads the metadata of every OCI image of the plan from its
// manifest annotations, and takes other images as declared. Hand-declared
// fields win over annotations. One failing image does not stop the others:
// every failure is collected into a *ResolveError.
func Resolve(ctx context.Context, plan Plan, fetcher ManifestFetcher, opts ResolveOptions) (osimage.Catalog, error) {
	if opts.Concurrency <= 0 {
		opts.Concurrency = 8
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 60 * time.Second
	}
	images := make([]osimage.Image, len(plan.Sources))
	failures := make([]*Failure, len(plan.Sources))

	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(opts.Concurrency)
	for i, src := range plan.Sources {
		g.Go(func() error {
			if plan.RequireSignatures && src.IsOCI() && len(src.SigningKeys) == 0 {
				// Refused before any request: no key could verify it.
				failures[i] = &Failure{Key: src.Key, URI: src.URI, Cause: signature.UnsignedError(src.URI).Error()}
				return nil
			}
			img, err := resolveOne(gctx, src, fetcher, opts.Signatures, opts.Timeout)
			if err != nil {
				failures[i] = &Failure{Key: src.Key, URI: src.URI, Cause: describe(err, opts.Timeout)}
				return nil
			}
			images[i] = img
			return nil
		})
	}
	_ = g.Wait()
	if ctx.Err() != nil {
		done := 0
		for i := range plan.Sources {
			if images[i] != nil || failures[i] != nil {
				done++
			}
		}
		return nil, fmt.Errorf("stopped with %d of %d images resolved: %w", done, len(plan.Sources), context.Cause(ctx))
	}

	out := make(osimage.Catalog, len(images))
	var report ResolveError
	for i, src := range plan.Sources {
		if failures[i] != nil {
			report.Failures = append(report.Failures, *failures[i])
			continue
		}
		out[src.Key] = images[i]
	}
	report.Total = len(plan.Sources)
	if len(report.Failures) > 0 {
		return nil, &report
	}
	return out, nil
}

func resolveOne(ctx context.Context, src Source, fetcher ManifestFetcher, sigs SignatureVerifier, timeout time.Duration) (osimage.Image, error) {
	img := osimage.Image{}
	var manifestDigest digest.Digest
	if src.IsOCI() {
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		m, err := fetcher.FetchManifest(ctx, src.URI)
		if err != nil {
			return nil, err
		}
		manifestDigest = m.Descriptor.Digest
		if err := checkShape(m); err != nil {
			return nil, err
		}
		if pin := digest.Digest(src.Declared.Get(osimage.FieldManifestDigest)); pin != "" && pin != manifestDigest {
			return nil, fmt.Errorf("manifest digest mismatch: os_images.%s.%s pins %s, but the tag now resolves to %s; update the pin or the tag",
				src.Key, osimage.FieldManifestDigest, pin, manifestDigest)
		}
		// The signature is checked against the digest of the manifest whose
		// annotations are read: what is published is what was signed.
		if err := src.SigningKeys.Verify(ctx, sigs, src.URI, m.Descriptor.Digest, signAdvice); err != nil {
			return nil, err
		}
		img = osimage.FieldsFromAnnotations(m.Annotations)
		if err := checkIdentity(img, "annotation "+osimage.AnnotationPrefix); err != nil {
			return nil, err
		}
	}
	img[osimage.FieldURI] = src.URI
	if src.RegistryKey != "" {
		img[osimage.FieldRegistryKey] = src.RegistryKey
	}
	for k, v := range src.Declared {
		if v == nil {
			delete(img, k) // a declared null removes the field
			continue
		}
		img[k] = v
	}
	if manifestDigest != "" {
		img[osimage.FieldManifestDigest] = manifestDigest.String()
	}
	// The server refuses a malformed size (osimage.ParseSize); so does the
	// catalog, rather than publish an image that can never be served.
	for _, f := range []string{osimage.FieldSize, osimage.FieldArchiveSize} {
		if _, err := img.Size(f); err != nil {
			where := "annotation " + osimage.AnnotationPrefix
			if _, declared := src.Declared[f]; declared {
				where = "os_images." + src.Key + "."
			}
			return nil, fmt.Errorf("%s%w", where, err)
		}
	}
	if src.IsOCI() && img.Get(osimage.FieldSHA256) == "" {
		return nil, errNoSHA256
	}
	return img, nil
}

// signAdvice ends the refusal of a signature: how to get out of it.
const signAdvice = "; sign the artifact with its private key, fix the key, or set " + SkipPath + ": true to publish unsigned images"

// checkShape refuses what the image server would refuse at download time
// anyway: an index (one tag for several platforms) and a manifest with
// other than the one layer that holds the image file.
func checkShape(m oci.Manifest) error {
	for _, mt := range []string{m.Descriptor.MediaType, m.MediaType} {
		if mt == ocispec.MediaTypeImageIndex || mt == mediaTypeDockerManifestList {
			return fmt.Errorf("not an OS image artifact: %s is an index (%s), not an image manifest; point the URI at the artifact's own tag or digest", m.Descriptor.Digest, mt)
		}
	}
	if n := len(m.Layers); n != 1 {
		return fmt.Errorf("not an OS image artifact: manifest %s has %d layers, an OS image artifact has exactly one (the image file)", m.Descriptor.Digest, n)
	}
	return nil
}

const mediaTypeDockerManifestList = "application/vnd.docker.distribution.manifest.list.v2+json"

var errNoSHA256 = errors.New("no sha256 annotation: the manifest has no " + osimage.AnnotationPrefix + "sha256, and os_images declares none (was it published by diskimage-builder?)")

// Failure is one image that could not be resolved.
type Failure struct {
	Key, URI, Cause string
}

// ResolveError reports every image that failed. Callers exit 1 on it.
type ResolveError struct {
	Total    int
	Failures []Failure
}

func (e *ResolveError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d of %d images could not be resolved:", len(e.Failures), e.Total)
	for _, f := range e.Failures {
		fmt.Fprintf(&b, "\n  %s (%s): %s", f.Key, f.URI, f.Cause)
	}
	return b.String()
}

// describe turns a fetch error into the cause an operator acts on.
func describe(err error, timeout time.Duration) string {
	var respErr *errcode.ErrorResponse
	var unknownCA x509.UnknownAuthorityError
	var hostErr x509.HostnameError
	var invalidCert x509.CertificateInvalidError
	var verifyErr *tls.CertificateVerificationError
	var netErr net.Error
	switch {
	case errors.Is(err, errNoSHA256):
		return err.Error()
	case errors.As(err, &respErr) && (respErr.StatusCode == http.StatusUnauthorized || respErr.StatusCode == http.StatusForbidden):
		return fmt.Sprintf("unauthorized: the registry answered %d; check the credentials for %s in the registry config (--registry-config)", respErr.StatusCode, respErr.URL.Host)
	case errors.Is(err, errdef.ErrNotFound) || errors.As(err, &respErr) && respErr.StatusCode == http.StatusNotFound:
		return "tag not found: the registry has no such repository or tag"
	case errors.As(err, &unknownCA) || errors.As(err, &hostErr) || errors.As(err, &invalidCert) || errors.As(err, &verifyErr):
		return fmt.Sprintf("TLS: %v; add the registry's CA with --ca-file, or set oci_registry_insecure: true", rootCause(err))
	case errors.Is(err, context.DeadlineExceeded) || errors.As(err, &netErr) && netErr.Timeout():
		return fmt.Sprintf("timeout: no answer within %s", timeout)
	case errors.Is(err, syscall.ECONNREFUSED):
		// The cause alone reads "connection refused": say where, and
		// what an operator checks.
		return fmt.Sprintf("connection refused at %s: no registry answers there; check the registry's address in the values (the image's URI) and that the registry is running and listening on that port", refusedAt(err))
	case errors.As(err, &respErr):
		return fmt.Sprintf("registry answered %d: %v", respErr.StatusCode, err)
	default:
		return err.Error()
	}
}

// refusedAt names the registry a refused connection was for: its URL,
// scheme and host, and the address dialled when the host is a name.
func refusedAt(err error) string {
	var urlErr *url.Error
	var opErr *net.OpError
	where := "the registry's address"
	if errors.As(err, &urlErr) {
		if u, perr := url.Parse(urlErr.URL); perr == nil && u.Host != "" {
			where = u.Scheme + "://" + u.Host
		}
	}
	if errors.As(err, &opErr) && opErr.Addr != nil && !strings.Contains(where, opErr.Addr.String()) {
		where += " (" + opErr.Addr.String() + ")"
	}
	return where
}

func rootCause(err error) error {
	for {
		next := errors.Unwrap(err)
		if next == nil {
			return err
		}
		err = next
	}
}
