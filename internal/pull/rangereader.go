package pull

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// errRestart says that the server can no longer continue where the
// transfer stopped (it ignored a Range, or answered another one), so the
// whole pass must start again from byte 0.
var errRestart = errors.New("the server did not resume at the requested offset")

// opener sends one GET with header and returns the response, whatever its
// status. Each call starts from the original URL, so redirects (to a CDN
// with expiring signatures, say) are followed afresh.
type opener func(ctx context.Context, header http.Header) (*http.Response, error)

// rangeReader reads one remote object from byte 0 to its end, resuming cut
// transfers with closed ranges. Bytes it has returned are never requested
// again; when the server cannot continue at the offset it returns an error
// wrapping errRestart.
type rangeReader struct {
	ctx  context.Context
	open opener
	// what names the object in errors: its URL.
	what string
	// size is the object's length, -1 while unknown.
	size int64
	// chunk is the length of a range asked while size is unknown.
	chunk int64
	knobs *Puller

	off      int64
	body     io.ReadCloser
	cancel   context.CancelFunc
	idle     *time.Timer
	failures int // requests since bytes last arrived
	lastErr  error

	resumes  int
	network  int64
	progress Progress
	// failed is the error that ended the transfer, if any.
	failed error
}

// err is the error that ended the transfer, nil while it goes on or once it
// reached its end.
func (r *rangeReader) err() error { return r.failed }

func (r *rangeReader) Read(p []byte) (int, error) {
	n, err := r.read(p)
	if err != nil && !errors.Is(err, io.EOF) {
		r.failed = err
	}
	return n, err
}

func (r *rangeReader) read(p []byte) (int, error) {
	for {
		if r.size >= 0 && r.off >= r.size {
			return 0, r.finish()
		}
		if r.body == nil {
			if err := r.connect(); err != nil {
				return 0, err
			}
		}
		if r.size >= 0 && int64(len(p)) > r.size-r.off {
			p = p[:r.size-r.off]
		}
		// The idle timer runs only while waiting for the network, so that
		// a slow disk downstream does not count as a stalled server.
		r.idle.Reset(r.knobs.idleTimeout())
		n, err := r.body.Read(p)
		r.idle.Stop()
		if n > 0 {
			r.off += int64(n)
			r.network += int64(n)
			r.failures = 0
			if r.progress != nil {
				r.progress(r.off, max(r.size, 0))
			}
			if err != nil {
				// Deal with it on the next call, so these bytes are used.
				r.closeBody()
				r.lastErr = err
				if errors.Is(err, io.EOF) && r.size < 0 {
					r.size = r.off
				}
			}
			return n, nil
		}
		if err == nil {
			continue
		}
		r.closeBody()
		if errors.Is(err, io.EOF) && r.size < 0 {
			// Without a known length the server's end is the end: Go
			// reports a body cut short of its Content-Length or of its
			// final chunk as io.ErrUnexpectedEOF, not io.EOF.
			r.size = r.off
			return 0, io.EOF
		}
		if ctxErr := r.ctx.Err(); ctxErr != nil {
			return 0, ctxErr
		}
		// A cut connection, a stall (the idle timer cancels the request) or
		// a body shorter than announced: continue from r.off.
		r.lastErr = err
	}
}

// connect opens the next request: a plain GET at offset 0, a closed range
// after that. It retries, with backoff, failures that may pass.
func (r *rangeReader) connect() error {
	for {
		if r.failures > r.knobs.maxRetries() {
			return fmt.Errorf("GET %s: giving up after %d attempts without receiving a byte, at byte %d%s: %w",
				r.what, r.failures, r.off, r.ofSize(), r.lastErr)
		}
		if r.failures > 0 {
			if err := sleep(r.ctx, r.knobs.backoff(r.failures)); err != nil {
				return err
			}
		}
		r.failures++

		header := http.Header{
			// Go would otherwise ask for gzip and decompress transparently,
			// which breaks both offsets and digests.
			"Accept-Encoding": {"identity"},
		}
		var asked string
		if r.off > 0 {
			end := r.size - 1
			if r.size < 0 {
				end = r.off + r.chunk - 1
			}
			// Closed: some registries refuse open-ended ranges with 416.
			asked = fmt.Sprintf("bytes=%d-%d", r.off, end)
			header.Set("Range", asked)
			r.resumes++
		}
		ctx, cancel := context.WithCancel(r.ctx)
		// The idle timer also bounds the wait for the response headers.
		idle := time.AfterFunc(r.knobs.idleTimeout(), cancel)
		resp, err := r.open(ctx, header)
		if err != nil {
			idle.Stop()
			cancel()
			if ctxErr := r.ctx.Err(); ctxErr != nil {
				return ctxErr
			}
			if permanent(err) {
				return fmt.Errorf("GET %s: %w; add the server's CA with --ca-file, or set oci_registry_insecure: true", r.what, err)
			}
			r.lastErr = err
			continue
		}
		accept := func() error {
			r.body, r.cancel, r.idle = resp.Body, cancel, idle
			return nil
		}
		reject := func(err error) error {
			idle.Stop()
			resp.Body.Close()
			cancel()
			return err
		}
		if ce := resp.Header.Get("Content-Encoding"); ce != "" && !strings.EqualFold(ce, "identity") {
			return reject(fmt.Errorf("GET %s: the server sent Content-Encoding %q although identity was asked; serve the file as is", r.what, ce))
		}

		switch code := resp.StatusCode; {
		case code == http.StatusOK && r.off == 0:
			if resp.ContentLength >= 0 {
				if r.size >= 0 && resp.ContentLength != r.size {
					return reject(&VerifyError{What: WhatDownloadSize, Expected: strconv.FormatInt(r.size, 10), Actual: strconv.FormatInt(resp.ContentLength, 10) + " (Content-Length of " + r.what + ")"})
				}
				r.size = resp.ContentLength
			}
			return accept()
		case code == http.StatusOK:
			// The range was ignored: appending this body would corrupt the
			// file.
			return reject(fmt.Errorf("GET %s with Range %s: answered 200, the range was ignored: %w", r.what, asked, errRestart))
		case code == http.StatusPartialContent && r.off > 0:
			start, end, total, err := parseContentRange(resp.Header.Get("Content-Range"))
			if err != nil || start != r.off || end < start || (r.size >= 0 && total >= 0 && total != r.size) {
				return reject(fmt.Errorf("GET %s with Range %s: answered 206 with Content-Range %q: %w", r.what, asked, resp.Header.Get("Content-Range"), errRestart))
			}
			if r.size < 0 {
				if total < 0 {
					return reject(fmt.Errorf("GET %s: cannot resume at byte %d: the server gives neither a Content-Length nor the total in Content-Range %q", r.what, r.off, resp.Header.Get("Content-Range")))
				}
				r.size = total
			}
			return accept()
		case code == http.StatusRequestedRangeNotSatisfiable:
			return reject(fmt.Errorf("GET %s with Range %s: 416 Range Not Satisfiable: the object is shorter than the %d bytes expected%s", r.what, asked, r.off, r.ofSize()))
		case code == http.StatusRequestTimeout || code == http.StatusTooManyRequests || code >= 500:
			r.lastErr = fmt.Errorf("%s", resp.Status)
			reject(nil)
			continue
		default:
			return reject(fmt.Errorf("GET %s: %s", r.what, statusText(resp)))
		}
	}
}

// finish ends a transfer that reached the expected length. It reads the
// body's own end, which lets the connection be reused and catches a server
// that sends more than expected.
func (r *rangeReader) finish() error {
	if r.body == nil {
		return io.EOF
	}
	var one [1]byte
	n, _ := r.body.Read(one[:])
	r.closeBody()
	if n > 0 {
		return &VerifyError{What: WhatDownloadSize, Expected: strconv.FormatInt(r.size, 10), Actual: "more than that from " + r.what}
	}
	return io.EOF
}

func (r *rangeReader) closeBody() {
	if r.body != nil {
		r.idle.Stop()
		r.body.Close()
		r.cancel()
		r.body = nil
	}
}

func (r *rangeReader) ofSize() string {
	if r.size < 0 {
		return ""
	}
	return " of " + strconv.FormatInt(r.size, 10)
}

// permanent tells errors that retrying cannot fix: TLS verification
// failures, which need a CA file or the insecure setting.
func permanent(err error) bool {
	var unknownCA x509.UnknownAuthorityError
	var hostname x509.HostnameError
	var invalid x509.CertificateInvalidError
	var verify *tls.CertificateVerificationError
	return errors.As(err, &unknownCA) || errors.As(err, &hostname) || errors.As(err, &invalid) || errors.As(err, &verify)
}

// parseContentRange parses "bytes first-last/total"; total is -1 for "*".
func parseContentRange(v string) (first, last, total int64, err error) {
	bad := fmt.Errorf("malformed Content-Range %q", v)
	rest, ok := strings.CutPrefix(v, "bytes ")
	if !ok {
		return 0, 0, 0, bad
	}
	rng, tot, ok := strings.Cut(rest, "/")
	if !ok {
		return 0, 0, 0, bad
	}
	a, b, ok := strings.Cut(rng, "-")
	if !ok {
		return 0, 0, 0, bad
	}
	if first, err = strconv.ParseInt(a, 10, 64); err != nil || first < 0 {
		return 0, 0, 0, bad
	}
	if last, err = strconv.ParseInt(b, 10, 64); err != nil || last < first {
		return 0, 0, 0, bad
	}
	total = -1
	if tot != "*" {
		if total, err = strconv.ParseInt(tot, 10, 64); err != nil || total <= last {
			return 0, 0, 0, bad
		}
	}
	return first, last, total, nil
}

func statusText(resp *http.Response) string {
	msg := resp.Status
	switch resp.StatusCode {
	case http.StatusUnauthorized, http.StatusForbidden:
		msg += ": check the registry credentials (--registry-config)"
	case http.StatusNotFound:
		msg += ": check the image URI"
	}
	return msg
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// jitter spreads retries of concurrent pulls.
func jitter(d time.Duration) time.Duration {
	return d/2 + time.Duration(rand.Int64N(int64(d/2)+1))
}
