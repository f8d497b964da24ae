// Package pull downloads an OS image from an OCI registry or an HTTP(S)
// server and verifies it, in one streaming pass over the network bytes:
// blob digest, gunzip, sha256, md5 and the write to the destination all
// happen as the bytes arrive, in constant memory. A cut transfer resumes
// with closed ranges, so no byte is downloaded twice.
package pull

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/sylva-projects/osimages/internal/oci"
	"github.com/sylva-projects/osimages/internal/osimage"
)

// Source is an image to pull and what it must turn out to be.
type Source struct {
	// URI is oci://host/repo:tag (or @digest), or an http(s):// URL.
	URI string
	// SHA256 and MD5 are the expected digests of the served (decompressed)
	// file. SHA256 is required; an empty MD5 is not checked.
	SHA256 osimage.SHA256
	MD5    string
	// Compression is "gz" when the artifact layer or download is a gzip
	// archive of the file, "" when it is the file.
	Compression string
	// Size is the expected length of the served file; 0 means unknown.
	Size int64
	// ArchiveSize is the expected length of the artifact layer or the
	// download; 0 means unknown.
	ArchiveSize int64
	// ManifestDigest, for an OCI source, pins the manifest: when the tag
	// resolves to another one (it was moved after the catalog read it), the
	// pull stops with a *VerifyError before any byte of the layer is asked.
	// It is parsed where the record is read (osimage.Image.Descriptor),
	// which refuses a malformed one: a digest that is not one matches none.
	ManifestDigest digest.Digest
	// BlobDigest, for an http(s) source, is the digest the download must
	// have (the layer a peer keeps, say); empty means not checked. OCI
	// sources take it from the manifest.
	BlobDigest string
	// CheckManifest, for an OCI source, is called with the digest of the
	// manifest resolved, whose layer is the one downloaded, before any byte
	// of it is asked (a signature check, say); an error stops the pull. It
	// gets the client the puller reaches the registry with.
	CheckManifest func(ctx context.Context, client *oci.Client, d digest.Digest) error
}

// Destination receives the served file. Reset discards what was written,
// for when the server cannot resume and the pass starts again at byte 0;
// *imagestore.Writer is one.
type Destination interface {
	io.Writer
	Reset() error
}

// BlobKeeper is a Destination that also keeps the network bytes of a
// compressed layer, as they arrive (for peers to stream them, and for a
// Resumable destination to continue them; see imagestore.Writer.KeepBlob).
// BlobWriter is called before each pass with the blob's digest ("" for an
// HTTP source without one) and length (0 when unknown); a nil writer keeps
// nothing. The pull fails if that writer fails.
type BlobKeeper interface {
	BlobWriter(digest string, size int64) (io.Writer, error)
}

// Progress reports network bytes: received is the offset reached in the
// download, total its length or 0 while unknown. It is called once before
// each pass with the offset the pass starts from (above 0 when it continues
// bytes kept by an earlier pull), again with that offset every few MiB while
// the kept bytes are read back and checked (no network byte comes then, but
// the pull is alive), then as network bytes arrive. It is called often,
// from the pulling goroutine: keep it cheap (an atomic store, say).
type Progress func(received, total int64)

// Result describes a verified pull.
type Result struct {
	// SHA256 and MD5 are the hex digests of the file written.
	SHA256, MD5 string
	// Size is the length of the file written.
	Size int64
	// BlobDigest is the OCI digest of the layer, verified; empty for
	// HTTP(S) sources.
	BlobDigest string
	// NetworkBytes counts the body bytes received, over all requests.
	NetworkBytes int64
	// Resumes counts the range requests that continued a cut transfer.
	Resumes int
	// Restarts counts the passes started again from byte 0 because the
	// server would not resume, or the bytes kept from an earlier pull did
	// not match their checkpoint, or did not decompress or verify.
	Restarts int
	// Kept is the count of network bytes an earlier pull into a Resumable
	// destination kept, checked and continued from, not downloaded again.
	Kept int64
	// KeptDiscarded says why bytes kept by an earlier pull were thrown
	// away ("" when they were not).
	KeptDiscarded string
	// Reached is how far the network bytes of the last pass into a
	// Resumable destination went (the kept ones included), and Checkpoint
	// where its last checkpoint is: a next pull continues from there. A
	// pull stopped by its context, or by a network failure, checkpoints
	// every byte it received: the two are equal.
	Reached, Checkpoint int64
}

// What a VerifyError is about.
const (
	WhatBlobDigest   = "blob digest"
	WhatSHA256       = "sha256"
	WhatMD5          = "md5"
	WhatSize         = "size"
	WhatDownloadSize = "download size"
	WhatManifest     = "manifest digest"
)

// VerifyError says that the content is not what it should be.
type VerifyError struct {
	// What is one of the What* constants.
	What string
	// Expected and Actual are the values compared.
	Expected, Actual string
}

func (e *VerifyError) Error() string {
	msg := fmt.Sprintf("%s mismatch: expected %s, got %s", e.What, e.Expected, e.Actual)
	switch e.What {
	case WhatBlobDigest:
		msg += ": the registry, or something between it and osimages, sent other bytes than the manifest describes"
	case WhatSHA256, WhatMD5, WhatSize:
		msg += fmt.Sprintf(": the image's %s field does not describe the file the artifact holds; fix the image metadata or the artifact", e.What)
	case WhatDownloadSize:
		msg += ": the artifact is not the one the image metadata (archive-size) describes"
	case WhatManifest:
		msg += ": the tag now names another manifest than the one the catalog resolved (and verified, when signed); nothing was downloaded; run the catalog again to publish the new one"
	}
	return msg
}

// Puller pulls images. Its zero value needs OCI or HTTP set for the sources
// used; the other fields have defaults. It is safe for concurrent use.
type Puller struct {
	// OCI serves oci:// sources, and, when HTTP is nil, lends its
	// transport (CA, TLS, proxy) to http(s):// ones.
	OCI *oci.Client
	// HTTP serves http(s):// sources. No credentials are sent.
	HTTP *http.Client

	// MaxRetries bounds the requests in a row that bring no byte (refused
	// connections, 5xx, connections cut before the first byte). Default 6.
	MaxRetries int
	// MaxRestarts bounds the passes started again from byte 0 because a
	// server would not resume. Default 2.
	MaxRestarts int
	// Backoff is the wait before the first retry, doubled for each next one
	// up to MaxBackoff, with jitter. Defaults 500ms and 30s.
	Backoff, MaxBackoff time.Duration
	// IdleTimeout cuts and resumes a request that brings no byte for that
	// long. Default 60s.
	IdleTimeout time.Duration
	// ManifestTimeout bounds the resolution of an OCI source: the manifest
	// fetch, retries included, and the CheckManifest call (a signature
	// check). A registry that sends the manifest's headers and then stalls
	// fails the pull after that long. Default 60s.
	ManifestTimeout time.Duration
	// RangeChunk is the length asked when resuming a download of unknown
	// length. Default 8 MiB.
	RangeChunk int64
	// BufferSize and Buffers shape the pipeline between decompression and
	// the hashes and the write: Buffers buffers of BufferSize bytes.
	// Defaults 256 KiB and 16.
	BufferSize, Buffers int
	// CheckpointBytes and CheckpointInterval set how often a Resumable
	// destination is checkpointed: every CheckpointBytes network bytes,
	// and once a CheckpointInterval when fewer came. The writes wait for
	// a checkpoint that falls 4 × CheckpointBytes behind (a slow disk):
	// a crash loses at most that of what was written. Defaults 2 MiB
	// and 1s.
	CheckpointBytes    int64
	CheckpointInterval time.Duration
}

func (p *Puller) maxRetries() int            { return def(p.MaxRetries, 6) }
func (p *Puller) maxRestarts() int           { return def(p.MaxRestarts, 2) }
func (p *Puller) bufferSize() int            { return def(p.BufferSize, 256<<10) }
func (p *Puller) buffers() int               { return max(def(p.Buffers, 16), 2) }
func (p *Puller) rangeChunk() int64          { return def(p.RangeChunk, 8<<20) }
func (p *Puller) idleTimeout() time.Duration { return def(p.IdleTimeout, 60*time.Second) }
func (p *Puller) checkpointBytes() int64     { return def(p.CheckpointBytes, 2<<20) }
func (p *Puller) checkpointInterval() time.Duration {
	return def(p.CheckpointInterval, time.Second)
}
func (p *Puller) manifestTimeout() time.Duration {
	return def(p.ManifestTimeout, 60*time.Second)
}

func (p *Puller) backoff(failures int) time.Duration {
	d, limit := def(p.Backoff, 500*time.Millisecond), def(p.MaxBackoff, 30*time.Second)
	for i := 1; i < failures && d < limit; i++ {
		d *= 2
	}
	return jitter(min(d, limit))
}

func def[T int | int64 | time.Duration](v, d T) T {
	if v > 0 {
		return v
	}
	return d
}

// Pull downloads src into dst and verifies it: the layer's OCI digest (of
// the network bytes), then the size, sha256 and md5 of the file written. On
// error dst holds garbage: discard it. Errors name src.URI; a content
// mismatch is a *VerifyError (errors.As). A Resumable dst keeps nothing of
// bytes that do not decompress or verify; and when a pull that continued
// kept bytes fails so, they are discarded and it starts again from byte 0.
func (p *Puller) Pull(ctx context.Context, src Source, dst Destination, progress Progress) (Result, error) {
	if err := normalize(&src); err != nil {
		return Result{}, err
	}
	obj, err := p.resolve(ctx, src)
	if err != nil {
		return Result{}, fmt.Errorf("pulling %s: %w", display(src.URI), err)
	}
	res := Result{BlobDigest: obj.digest.String()}
	resumable, _ := dst.(Resumable)
	keptChecked := false
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			if err := dst.Reset(); err != nil {
				return res, fmt.Errorf("pulling %s: starting again: %w", display(src.URI), err)
			}
			res.Restarts++
		}
		var plan *resumePlan
		if resumable != nil {
			plan = &resumePlan{dst: resumable, source: sourceID(src, obj)}
			if !keptChecked {
				keptChecked = true
				var kept io.ReadCloser
				if plan.offset, plan.sum, kept, err = resumable.Kept(plan.source); err != nil {
					return res, fmt.Errorf("pulling %s: %w", display(src.URI), err)
				}
				if kept != nil {
					defer kept.Close()
					plan.kept = kept
				}
				if plan.kept != nil && obj.size >= 0 && plan.offset > obj.size {
					// Not a prefix of this download, whatever it holds.
					res.KeptDiscarded = fmt.Sprintf("%v: it has %d bytes, more than the %d of the download", errKept, plan.offset, obj.size)
					if err := dst.Reset(); err != nil {
						return res, fmt.Errorf("pulling %s: %w", display(src.URI), err)
					}
					plan.kept, plan.offset, plan.sum = nil, 0, ""
				}
			}
		}
		var blob io.Writer
		if k, ok := dst.(BlobKeeper); ok && src.Compression != "" {
			if blob, err = k.BlobWriter(obj.digest.String(), max(obj.size, 0)); err != nil {
				return res, fmt.Errorf("pulling %s: %w", display(src.URI), err)
			}
		}
		if plan != nil && src.Compression != "" && blob == nil {
			// Only the blob lets a compressed download continue, and this
			// destination keeps none.
			if plan.kept != nil {
				if err := dst.Reset(); err != nil {
					return res, fmt.Errorf("pulling %s: %w", display(src.URI), err)
				}
			}
			plan = nil
		}
		from := int64(0)
		if plan != nil && plan.kept != nil {
			from = plan.offset
		}
		if progress != nil {
			progress(from, max(obj.size, 0))
		}
		rr := &rangeReader{
			open: obj.open, what: obj.what, size: obj.size, off: from,
			chunk: p.rangeChunk(), knobs: p, progress: progress,
		}
		got, err := p.pass(ctx, rr, src, obj, dst, blob, plan)
		res.NetworkBytes += rr.network
		if plan != nil {
			res.Reached, res.Checkpoint = plan.reached, plan.checkpointed
		}
		res.Resumes += rr.resumes
		if errors.Is(err, errKept) {
			// Damaged while the server was down: start again from byte 0,
			// as a server that cannot resume makes us do.
			res.KeptDiscarded = err.Error()
			continue
		}
		res.Kept = from
		if errors.Is(err, errRestart) && attempt < p.maxRestarts() {
			continue
		}
		if errors.Is(err, errRestart) {
			err = fmt.Errorf("%w; gave up after %d restarts from byte 0: the server cannot resume and the transfer keeps failing", err, attempt)
		}
		if err == nil {
			res.SHA256, res.MD5, res.Size = got.sha256, got.md5, got.size
			if err = verify(src, obj, got); err != nil {
				err = &contentError{err}
			}
		}
		var wrong *contentError
		if errors.As(err, &wrong) && resumable != nil {
			if from > 0 {
				// The kept bytes matched their checkpoint, yet the whole
				// is wrong: they may be what a faulty network sent before
				// they were kept. Without them, the registry decides.
				res.KeptDiscarded = fmt.Sprintf("the download continued from the %d bytes kept by an earlier attempt failed (%v): they are discarded, and the download starts again from byte 0", from, wrong.err)
				res.Kept = 0
				continue
			}
			// Nothing of a pass whose bytes are wrong is continued from.
			if rerr := dst.Reset(); rerr != nil {
				err = fmt.Errorf("%w; discarding what was written: %v", err, rerr)
			}
		}
		if err != nil {
			return res, fmt.Errorf("pulling %s: %w", display(src.URI), hint(err, src, obj))
		}
		return res, nil
	}
}

func normalize(src *Source) error {
	if src.SHA256 == "" {
		return fmt.Errorf("pulling %s: no sha256 given: the image needs a sha256 field to be verified", display(src.URI))
	}
	if src.MD5 != "" {
		if err := osimage.ValidateMD5(src.MD5); err != nil {
			return fmt.Errorf("pulling %s: %w", display(src.URI), err)
		}
	}
	if src.Compression != "" && src.Compression != "gz" {
		return fmt.Errorf("pulling %s: compression %q is not supported: use gz, or none", display(src.URI), src.Compression)
	}
	if src.Size < 0 || src.ArchiveSize < 0 {
		return fmt.Errorf("pulling %s: negative size", display(src.URI))
	}
	if src.BlobDigest != "" {
		if _, err := digest.Parse(src.BlobDigest); err != nil {
			return fmt.Errorf("pulling %s: blob digest %q: %w", display(src.URI), src.BlobDigest, err)
		}
	}
	return nil
}

// display is uri without the password it may hold, for messages.
func display(uri string) string {
	if u, err := url.Parse(uri); err == nil && u.User != nil {
		return u.Redacted()
	}
	return uri
}

// object is what to download: how to request it, its length (-1 when
// unknown) and, for OCI, the digest of its bytes.
type object struct {
	what      string
	open      opener
	size      int64
	digest    digest.Digest
	mediaType string
}

func (p *Puller) resolve(ctx context.Context, src Source) (object, error) {
	switch {
	case strings.HasPrefix(src.URI, "oci://"):
		return p.resolveOCI(ctx, src)
	case strings.HasPrefix(src.URI, "http://"), strings.HasPrefix(src.URI, "https://"):
		return p.resolveHTTP(src)
	}
	return object{}, errors.New("unsupported URI scheme: use oci://, http:// or https://")
}

func (p *Puller) resolveOCI(ctx context.Context, src Source) (object, error) {
	if p.OCI == nil {
		return object{}, errors.New("no OCI client configured")
	}
	ref, err := oci.ParseReference(src.URI)
	if err != nil {
		return object{}, err
	}
	ctx, cancel := context.WithTimeoutCause(ctx, p.manifestTimeout(), fmt.Errorf("no manifest within %s", p.manifestTimeout()))
	defer cancel()
	m, err := p.OCI.FetchManifest(ctx, src.URI)
	if err != nil {
		if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
			err = fmt.Errorf("%w: %w", cause, err)
		}
		return object{}, fmt.Errorf("fetching the manifest: %w", err)
	}
	if src.ManifestDigest != "" && m.Descriptor.Digest != src.ManifestDigest {
		return object{}, &VerifyError{What: WhatManifest, Expected: src.ManifestDigest.String(), Actual: m.Descriptor.Digest.String()}
	}
	if src.CheckManifest != nil {
		if err := src.CheckManifest(ctx, p.OCI, m.Descriptor.Digest); err != nil {
			return object{}, err
		}
	}
	if len(m.Layers) != 1 {
		return object{}, fmt.Errorf("manifest %s has %d layers: an OS image artifact has exactly one, the image file", m.Descriptor.Digest, len(m.Layers))
	}
	layer := m.Layers[0]
	if err := layer.Digest.Validate(); err != nil {
		return object{}, fmt.Errorf("manifest %s: layer digest %q: %w", m.Descriptor.Digest, layer.Digest, err)
	}
	if layer.Size < 0 {
		return object{}, fmt.Errorf("manifest %s: layer size %d is negative", m.Descriptor.Digest, layer.Size)
	}
	if src.ArchiveSize > 0 && layer.Size != src.ArchiveSize {
		return object{}, &VerifyError{What: WhatDownloadSize, Expected: strconv.FormatInt(src.ArchiveSize, 10), Actual: strconv.FormatInt(layer.Size, 10) + " (the layer's size in manifest " + m.Descriptor.Digest.String() + ")"}
	}
	return object{
		what: p.OCI.BlobURL(ref, layer.Digest),
		open: func(ctx context.Context, h http.Header) (*http.Response, error) {
			return p.OCI.GetBlob(ctx, ref, layer.Digest, h)
		},
		size:      layer.Size,
		digest:    layer.Digest,
		mediaType: layer.MediaType,
	}, nil
}

func (p *Puller) resolveHTTP(src Source) (object, error) {
	client := p.HTTP
	ua := "osimages"
	if p.OCI != nil {
		ua = p.OCI.UserAgent()
		if client == nil {
			client = p.OCI.HTTPClient()
		}
	}
	if client == nil {
		return object{}, errors.New("no HTTP client configured")
	}
	u, err := url.Parse(src.URI)
	if err != nil {
		return object{}, err
	}
	size := int64(-1)
	switch {
	case src.ArchiveSize > 0:
		size = src.ArchiveSize
	case src.Compression == "" && src.Size > 0:
		size = src.Size
	}
	return object{
		// Credentials in the URL stay out of errors and logs.
		what: u.Redacted(),
		open: func(ctx context.Context, h http.Header) (*http.Response, error) {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, src.URI, nil)
			if err != nil {
				return nil, err
			}
			for k, v := range h {
				req.Header[k] = v
			}
			req.Header.Set("User-Agent", ua)
			return client.Do(req)
		},
		size:   size,
		digest: digest.Digest(src.BlobDigest),
	}, nil
}

// hint adds the likely cause of a mismatch of the file: a gzip layer pulled
// as is because the image lacks its compression field.
func hint(err error, src Source, obj object) error {
	var v *VerifyError
	if errors.As(err, &v) && v.What != WhatBlobDigest && v.What != WhatDownloadSize &&
		src.Compression == "" && strings.Contains(obj.mediaType, "gzip") {
		return fmt.Errorf("%w (the layer's media type %s says gzip, but the image has no compression: gz field)", err, obj.mediaType)
	}
	return err
}

func verify(src Source, obj object, got passResult) error {
	if obj.digest != "" && got.blob != obj.digest.Encoded() {
		return &VerifyError{What: WhatBlobDigest, Expected: obj.digest.String(), Actual: string(obj.digest.Algorithm()) + ":" + got.blob}
	}
	if src.Size > 0 && got.size != src.Size {
		return &VerifyError{What: WhatSize, Expected: strconv.FormatInt(src.Size, 10), Actual: strconv.FormatInt(got.size, 10)}
	}
	if got.sha256 != string(src.SHA256) {
		return &VerifyError{What: WhatSHA256, Expected: string(src.SHA256), Actual: got.sha256}
	}
	if src.MD5 != "" && got.md5 != src.MD5 {
		return &VerifyError{What: WhatMD5, Expected: src.MD5, Actual: got.md5}
	}
	return nil
}
