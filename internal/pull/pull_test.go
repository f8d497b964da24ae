package pull

import (
	"bytes"
	"context"
	"crypto/md5"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/klauspost/compress/gzip"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"oras.land/oras-go/v2"
	"oras.land/oras-go/v2/content"
	"oras.land/oras-go/v2/registry/remote"

	"github.com/sylva-projects/osimages/internal/devregistry"
	"github.com/sylva-projects/osimages/internal/oci"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/testenv"
)

func TestPullOCIArtifacts(t *testing.T) {
	for _, tc := range []struct {
		name           string
		gz, tls, creds bool
	}{
		{name: "gz", gz: true},
		{name: "raw"},
		{name: "gz over verified TLS", gz: true, tls: true},
		{name: "raw with credentials", creds: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ropts := devregistry.Options{TLS: tc.tls}
			if tc.creds {
				ropts.Username, ropts.Password = "sylva", "s3cret"
			}
			reg := newRegistry(t, ropts)
			opts := oci.Options{Insecure: !tc.tls}
			if tc.tls {
				opts.CAFile = reg.CAFile
			}
			if tc.creds {
				opts.RegistryConfig = dockerConfig(t, reg.Host, "sylva", "s3cret")
			}
			content := devregistry.DiskContent(5<<20+777, 11)
			src, pub := publish(t, reg, "dib/ubuntu-"+strings.ToLower(strings.ReplaceAll(tc.name, " ", "-")), content, tc.gz, nil)
			store := openStore(t)

			var last [2]int64
			var calls int
			e, res, err := fastPuller(ociClient(t, opts)).PullInto(context.Background(), store, "ubuntu.raw", src, func(received, total int64) {
				calls++
				if received < last[0] {
					t.Errorf("progress went back from %d to %d", last[0], received)
				}
				last = [2]int64{received, total}
			})
			if err != nil {
				t.Fatal(err)
			}
			assertStored(t, store, content)
			m := md5.Sum(content)
			if e.Filename != "ubuntu.raw" || e.MD5 != hex.EncodeToString(m[:]) || e.Size != int64(len(content)) {
				t.Errorf("entry = %+v", e)
			}
			if res.BlobDigest != pub.LayerDigest.String() || osimage.SHA256(res.SHA256) != src.SHA256 || res.MD5 != src.MD5 || res.Size != src.Size {
				t.Errorf("result = %+v, published %+v", res, pub)
			}
			if res.NetworkBytes != src.ArchiveSize || res.Resumes != 0 || res.Restarts != 0 {
				t.Errorf("received %d bytes in %d resumes and %d restarts; want the %d of the layer in one request", res.NetworkBytes, res.Resumes, res.Restarts, src.ArchiveSize)
			}
			if calls == 0 || last != [2]int64{src.ArchiveSize, src.ArchiveSize} {
				t.Errorf("last progress = %v after %d calls, want [%d %d]", last, calls, src.ArchiveSize, src.ArchiveSize)
			}
			if tc.creds {
				// Without credentials the blob stays out of reach.
				_, err := fastPuller(ociClient(t, oci.Options{Insecure: true})).Pull(context.Background(), src, &memDest{}, nil)
				if err == nil || !strings.Contains(err.Error(), "credential") {
					t.Errorf("pull without credentials: %v, want a credential error", err)
				}
			}
			// Stored already: no second download.
			if _, res, err := fastPuller(ociClient(t, opts)).PullInto(context.Background(), store, "ubuntu.raw", src, nil); err != nil || res.NetworkBytes != 0 {
				t.Errorf("second pull: %+v, %v", res, err)
			}
		})
	}
}

func TestPullHTTPSources(t *testing.T) {
	content := devregistry.DiskContent(3<<20+5, 5)
	var gzBuf bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&gzBuf, gzip.BestSpeed)
	zw.Write(content)
	zw.Close()
	m := md5.Sum(content)
	for _, tc := range []struct {
		name    string
		gz, tls bool
	}{
		{"raw over HTTP", false, false},
		{"gz over HTTP", true, false},
		{"raw over HTTPS with a CA file", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			body := content
			src := Source{SHA256: shaHex(content), MD5: hex.EncodeToString(m[:]), Size: int64(len(content))}
			if tc.gz {
				body = gzBuf.Bytes()
				src.Compression, src.ArchiveSize = "gz", int64(len(body))
			}
			srv, _, sent := fileServer(t, body, tc.tls)
			src.URI = srv.URL + "/img"
			opts := oci.Options{}
			if tc.tls {
				opts.CAFile = caFile(t, srv)
			}
			store := openStore(t)
			_, res, err := fastPuller(ociClient(t, opts)).PullInto(context.Background(), store, "img.raw", src, nil)
			if err != nil {
				t.Fatal(err)
			}
			assertStored(t, store, content)
			if res.BlobDigest != "" || res.NetworkBytes != int64(len(body)) || sent.Load() != int64(len(body)) {
				t.Errorf("result %+v, server sent %d; want %d bytes once", res, sent.Load(), len(body))
			}
		})
	}

	t.Run("HTTPS without the CA is refused", func(t *testing.T) {
		srv, _, _ := fileServer(t, content, true)
		// Production waits: a certificate error must not be retried.
		p := &Puller{OCI: ociClient(t, oci.Options{})}
		start := time.Now()
		_, err := p.Pull(context.Background(), Source{URI: srv.URL + "/img", SHA256: shaHex(content)}, &memDest{}, nil)
		if err == nil || !strings.Contains(err.Error(), "certificate") || !strings.Contains(err.Error(), srv.URL) {
			t.Fatalf("error = %v, want a certificate error naming the URL", err)
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("a certificate error took %v: it was retried", d)
		}
	})
}

// TestPullRefusesCorruptedLayer, into a plain writer and into a resumable
// one as the server uses (which keeps a gzip layer beside the image).
func TestPullRefusesCorruptedLayer(t *testing.T) {
	for _, tc := range []struct{ gz, resumable bool }{{false, false}, {true, false}, {false, true}, {true, true}} {
		t.Run(fmt.Sprintf("gz=%v,resumable=%v", tc.gz, tc.resumable), func(t *testing.T) {
			t.Parallel()
			faults := &devregistry.Faults{}
			reg := registryWith(t, faults.Middleware)
			content := devregistry.DiskContent(2<<20, 21)
			src, pub := publish(t, reg, "dib/corrupted", content, tc.gz, nil)
			faults.Set("dib/corrupted", devregistry.Blobs, devregistry.Corrupt(1000))
			store := openStore(t)

			p := fastPuller(ociClient(t, oci.Options{Insecure: true}))
			var err error
			if tc.resumable {
				w, werr := store.Resume(src.SHA256)
				if werr != nil {
					t.Fatal(werr)
				}
				_, err = p.Pull(context.Background(), src, w, nil)
				w.Abort()
			} else {
				_, _, err = p.PullInto(context.Background(), store, "img.raw", src, nil)
			}
			v := verifyError(t, err, WhatBlobDigest)
			if v.Expected != pub.LayerDigest.String() || !strings.HasPrefix(v.Actual, "sha256:") {
				t.Errorf("VerifyError = %+v", v)
			}
			if !strings.Contains(err.Error(), src.URI) {
				t.Errorf("error %q does not name the image", err)
			}
			assertNothingStored(t, store)
		})
	}
}

func TestPullRefusesWrongMetadata(t *testing.T) {
	reg := newRegistry(t, devregistry.Options{})
	content := devregistry.DiskContent(1<<20, 31)
	good := devregistry.DiskImageFields(content, "x", true)
	wrongSHA := strings.Repeat("ab", 32)
	for _, tc := range []struct {
		what   string
		fields osimage.Image
	}{
		{WhatSHA256, osimage.Image{osimage.FieldSHA256: wrongSHA}},
		{WhatMD5, osimage.Image{osimage.FieldMD5: strings.Repeat("cd", 16)}},
		{WhatSize, osimage.Image{osimage.FieldSize: "1048577"}},
		{WhatDownloadSize, osimage.Image{osimage.FieldArchiveSize: "12345"}},
	} {
		t.Run(tc.what, func(t *testing.T) {
			src, _ := publish(t, reg, "dib/wrong-"+strings.ReplaceAll(tc.what, " ", "-"), content, true, tc.fields)
			store := openStore(t)
			if tc.what == WhatSHA256 {
				// The store is addressed by the expected sha256: nothing
				// may land there.
				src.SHA256 = osimage.SHA256(wrongSHA)
			}
			_, _, err := fastPuller(ociClient(t, oci.Options{Insecure: true})).PullInto(context.Background(), store, "img.raw", src, nil)
			v := verifyError(t, err, tc.what)
			switch tc.what {
			case WhatSHA256:
				if v.Expected != wrongSHA || v.Actual != good[osimage.FieldSHA256] {
					t.Errorf("VerifyError = %+v", v)
				}
			case WhatMD5:
				if v.Actual != good[osimage.FieldMD5] {
					t.Errorf("VerifyError = %+v", v)
				}
			}
			assertNothingStored(t, store)
		})
	}
}

// TestPullResumesThroughCutConnections runs the pull through a proxy that
// cuts every connection after 384 KiB: the pull must succeed with closed
// ranges, and the registry must not send much more than the blob.
func TestPullResumesThroughCutConnections(t *testing.T) {
	for _, gz := range []bool{true, false} {
		t.Run(fmt.Sprintf("gz=%v", gz), func(t *testing.T) {
			t.Parallel()
			guard := &rangeGuard{}
			reg := registryWith(t, guard.wrap)
			proxy := testenv.StartCutProxy(t, reg.Host, 384<<10)
			content := devregistry.DiskContent(12<<20, 41)
			if !gz {
				content = content[:4<<20]
			}
			src, pub := publish(t, reg, "dib/flaky", content, gz, nil)
			src.URI = "oci://" + strings.Replace(pub.Ref, reg.Host, proxy.Addr, 1)
			store := openStore(t)

			_, res, err := fastPuller(ociClient(t, oci.Options{Insecure: true})).PullInto(context.Background(), store, "img.raw", src, nil)
			if err != nil {
				t.Fatal(err)
			}
			assertStored(t, store, content)
			blob := src.ArchiveSize
			wantResumes := int(blob / (384 << 10))
			if res.Resumes < wantResumes || res.Restarts != 0 || proxy.Cuts() < int64(wantResumes) {
				t.Errorf("%d resumes, %d restarts, %d cuts for a %d-byte blob; want at least %d resumes and no restart", res.Resumes, res.Restarts, proxy.Cuts(), blob, wantResumes)
			}
			if res.NetworkBytes != blob {
				t.Errorf("received %d body bytes, want exactly the %d of the blob", res.NetworkBytes, blob)
			}
			ratio := float64(proxy.Forwarded()) / float64(blob)
			t.Logf("blob %d bytes, registry sent %d through the proxy (%.3fx), %d resumes", blob, proxy.Forwarded(), ratio, res.Resumes)
			if ratio > 1.05 {
				t.Errorf("the registry sent %d bytes for a %d-byte blob: %.3fx, more than 1.05x", proxy.Forwarded(), blob, ratio)
			}
			ranges := guard.seen()
			if len(ranges) != res.Resumes {
				t.Errorf("registry saw %d ranges for %d resumes", len(ranges), res.Resumes)
			}
			for _, r := range ranges {
				if !closedRange.MatchString(r) || !strings.HasSuffix(r, fmt.Sprintf("-%d", blob-1)) {
					t.Errorf("range %q is not closed at the blob's last byte %d", r, blob-1)
				}
			}
		})
	}
}

// stripRange makes the registry ignore ranges: it answers 200 and the whole
// blob to every request, as some servers do.
func stripRange(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Header.Del("Range")
		next.ServeHTTP(w, r)
	})
}

func TestPullRestartsWhenTheRegistryIgnoresRanges(t *testing.T) {
	reg := registryWith(t, stripRange)
	proxy := testenv.StartCutProxy(t, reg.Host, 256<<10)
	content := devregistry.DiskContent(8<<20, 51)
	src, pub := publish(t, reg, "dib/norange", content, true, nil)
	src.URI = "oci://" + strings.Replace(pub.Ref, reg.Host, proxy.Addr, 1)
	// The first blob GET is cut; the resume gets a 200 and must not be
	// appended; the second pass gets everything.
	proxy.SetMaxCuts(1)
	store := openStore(t)
	_, res, err := fastPuller(ociClient(t, oci.Options{Insecure: true})).PullInto(context.Background(), store, "img.raw", src, nil)
	if err != nil {
		t.Fatal(err)
	}
	assertStored(t, store, content)
	if res.Restarts != 1 || res.Resumes != 1 {
		t.Errorf("%d restarts and %d resumes, want 1 and 1", res.Restarts, res.Resumes)
	}
}

func TestPullGivesUpWhenNeitherResumeNorCompleteIsPossible(t *testing.T) {
	reg := registryWith(t, stripRange)
	proxy := testenv.StartCutProxy(t, reg.Host, 256<<10)
	content := devregistry.DiskContent(4<<20, 52)
	src, pub := publish(t, reg, "dib/hopeless", content, false, nil)
	src.URI = "oci://" + strings.Replace(pub.Ref, reg.Host, proxy.Addr, 1)
	store := openStore(t)
	p := fastPuller(ociClient(t, oci.Options{Insecure: true}))
	p.MaxRestarts = 3
	_, res, err := p.PullInto(context.Background(), store, "img.raw", src, nil)
	if err == nil || !strings.Contains(err.Error(), "gave up after 3 restarts") || !strings.Contains(err.Error(), "200") {
		t.Fatalf("error = %v, want giving up after 3 restarts because of the 200s", err)
	}
	if res.Restarts != 3 {
		t.Errorf("%d restarts, want 3", res.Restarts)
	}
	assertNothingStored(t, store)
}

// cutOnce serves content, cutting the first full GET after cut bytes; when
// chunked, without Content-Length.
func cutOnce(t *testing.T, content []byte, cut int, chunked bool, g *rangeGuard, sent *atomic.Int64) string {
	var first atomic.Bool
	first.Store(true)
	h := g.wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w = countingWriter{w, sent}
		if r.Header.Get("Range") == "" && first.Swap(false) {
			if !chunked {
				w.Header().Set("Content-Length", fmt.Sprint(len(content)))
			}
			w.Write(content[:cut])
			w.(http.Flusher).Flush()
			panic(http.ErrAbortHandler) // drops the connection mid-body
		}
		http.ServeContent(w, r, "img", time.Time{}, bytes.NewReader(content))
	}))
	srv := newQuietServer(t, h)
	return srv + "/img"
}

func TestPullHTTPResumesWithClosedRanges(t *testing.T) {
	content := devregistry.DiskContent(4<<20, 61)
	for _, tc := range []struct {
		name       string
		chunked    bool
		knownSize  bool
		wantResume string
	}{
		{"length from Content-Length", false, false, fmt.Sprintf("bytes=%d-%d", 1<<20, len(content)-1)},
		{"length from the source", true, true, fmt.Sprintf("bytes=%d-%d", 1<<20, len(content)-1)},
		// Nothing tells the length: a closed chunk first, whose
		// Content-Range total gives it.
		{"length unknown", true, false, fmt.Sprintf("bytes=%d-%d", 1<<20, 1<<20+8<<20-1)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g, sent := &rangeGuard{}, &atomic.Int64{}
			src := Source{URI: cutOnce(t, content, 1<<20, tc.chunked, g, sent), SHA256: shaHex(content)}
			if tc.knownSize {
				src.Size = int64(len(content))
			}
			dst := &memDest{}
			res, err := fastPuller(ociClient(t, oci.Options{})).Pull(context.Background(), src, dst, nil)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(dst.Bytes(), content) || dst.resets != 0 {
				t.Fatalf("content differs or was reset %d times", dst.resets)
			}
			if r := g.seen(); len(r) != 1 || r[0] != tc.wantResume {
				t.Errorf("ranges asked: %q, want [%s]", r, tc.wantResume)
			}
			if res.Resumes != 1 || sent.Load() != int64(len(content)) {
				t.Errorf("%d resumes, server sent %d; want 1 and %d", res.Resumes, sent.Load(), len(content))
			}
		})
	}
}

func TestPullRestartsOnAWrongContentRange(t *testing.T) {
	content := devregistry.DiskContent(2<<20, 71)
	var calls atomic.Int32
	url := newQuietServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch calls.Add(1) {
		case 1:
			w.Header().Set("Content-Length", fmt.Sprint(len(content)))
			w.Write(content[:1<<20])
			panic(http.ErrAbortHandler)
		case 2:
			// A 206, but from the wrong offset.
			w.Header().Set("Content-Range", fmt.Sprintf("bytes 0-%d/%d", len(content)-1, len(content)))
			w.WriteHeader(http.StatusPartialContent)
			w.Write(content)
		default:
			http.ServeContent(w, r, "img", time.Time{}, bytes.NewReader(content))
		}
	})) + "/img"
	dst := &memDest{}
	res, err := fastPuller(nil).withHTTP().Pull(context.Background(), Source{URI: url, SHA256: shaHex(content)}, dst, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(dst.Bytes(), content) || dst.resets != 1 || res.Restarts != 1 {
		t.Fatalf("resets %d, restarts %d, content equal %v", dst.resets, res.Restarts, bytes.Equal(dst.Bytes(), content))
	}
}

func (p *Puller) withHTTP() *Puller {
	p.HTTP = &http.Client{}
	return p
}

func TestPullRetriesTransientFailures(t *testing.T) {
	content := []byte("a small image")
	var calls atomic.Int32
	url := newQuietServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) <= 3 {
			http.Error(w, "busy", http.StatusServiceUnavailable)
			return
		}
		w.Write(content)
	})) + "/img"
	dst := &memDest{}
	if _, err := fastPuller(nil).withHTTP().Pull(context.Background(), Source{URI: url, SHA256: shaHex(content)}, dst, nil); err != nil {
		t.Fatal(err)
	}
	if dst.String() != string(content) {
		t.Fatalf("got %q", dst.String())
	}

	t.Run("bounded", func(t *testing.T) {
		var calls atomic.Int32
		url := newQuietServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			calls.Add(1)
			http.Error(w, "broken", http.StatusBadGateway)
		})) + "/img"
		p := fastPuller(nil).withHTTP()
		p.MaxRetries = 3
		_, err := p.Pull(context.Background(), Source{URI: url, SHA256: shaHex(content)}, &memDest{}, nil)
		if err == nil || !strings.Contains(err.Error(), "502") || !strings.Contains(err.Error(), url) || !strings.Contains(err.Error(), "giving up after 4 attempts") {
			t.Fatalf("error = %v", err)
		}
		if calls.Load() != 4 {
			t.Errorf("%d requests, want 4", calls.Load())
		}
	})

	t.Run("not retried", func(t *testing.T) {
		var calls atomic.Int32
		url := newQuietServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			calls.Add(1)
			http.NotFound(w, r)
		})) + "/missing.raw"
		_, err := fastPuller(nil).withHTTP().Pull(context.Background(), Source{URI: url, SHA256: shaHex(content)}, &memDest{}, nil)
		if err == nil || !strings.Contains(err.Error(), "404") || !strings.Contains(err.Error(), url) || calls.Load() != 1 {
			t.Fatalf("error = %v after %d requests, want one 404 naming the URL", err, calls.Load())
		}
	})
}

func TestPullResumesAStalledTransfer(t *testing.T) {
	content := devregistry.DiskContent(2<<20, 81)
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	var first atomic.Bool
	first.Store(true)
	url := newQuietServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if first.Swap(false) {
			w.Header().Set("Content-Length", fmt.Sprint(len(content)))
			w.Write(content[:1<<20])
			w.(http.Flusher).Flush()
			select { // stalls without closing
			case <-release:
			case <-r.Context().Done():
			}
			return
		}
		http.ServeContent(w, r, "img", time.Time{}, bytes.NewReader(content))
	})) + "/img"
	p := fastPuller(nil).withHTTP()
	p.IdleTimeout = 300 * time.Millisecond
	dst := &memDest{}
	start := time.Now()
	res, err := p.Pull(context.Background(), Source{URI: url, SHA256: shaHex(content)}, dst, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(dst.Bytes(), content) || res.Resumes != 1 || time.Since(start) > 5*time.Second {
		t.Fatalf("resumes %d after %v", res.Resumes, time.Since(start))
	}
}

func TestPullStopsAnOversizedStream(t *testing.T) {
	reg := newRegistry(t, devregistry.Options{})
	// 32 MiB of zeros gzip to a few KiB: a small archive, a large file.
	content := make([]byte, 32<<20)
	src, _ := publish(t, reg, "dib/bomb", content, true, osimage.Image{osimage.FieldSize: "1048576"})
	dst := &memDest{}
	_, err := fastPuller(ociClient(t, oci.Options{Insecure: true})).Pull(context.Background(), src, dst, nil)
	verifyError(t, err, WhatSize)
	if dst.Len() > 8<<20 {
		t.Errorf("wrote %d bytes for an image announced at 1 MiB", dst.Len())
	}
}

func TestPullReportsArtifactErrors(t *testing.T) {
	reg := newRegistry(t, devregistry.Options{})
	ctx := context.Background()
	p := fastPuller(ociClient(t, oci.Options{Insecure: true}))

	t.Run("not gzip", func(t *testing.T) {
		content := []byte(strings.Repeat("not gzip ", 1000))
		src, _ := publish(t, reg, "dib/notgz", content, false, osimage.Image{osimage.FieldCompression: "gz"})
		_, err := p.Pull(ctx, src, &memDest{}, nil)
		if err == nil || !strings.Contains(err.Error(), "not a valid gzip archive") || !strings.Contains(err.Error(), src.URI) {
			t.Fatalf("error = %v", err)
		}
	})

	t.Run("gzip broken at its first block, into a resumable writer", func(t *testing.T) {
		// A gzip header, then a block of the reserved type: gunzip fails at
		// once, and the 2 MiB after it are read (through the blob kept) to
		// tell a transfer gone wrong from a bad archive.
		layer := append([]byte{0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff, 0x07}, devregistry.DiskContent(2<<20, 5)[:2<<20]...)
		p2, err := reg.Publish(ctx, devregistry.DiskImage{Repository: "dib/gz-broken", Tag: "1.0", Content: []byte("x"), Gzip: true, Layer: layer})
		if err != nil {
			t.Fatal(err)
		}
		src := sourceOf("oci://"+p2.Ref, p2.Fields)
		store := openStore(t)
		w, err := store.Resume(src.SHA256)
		if err != nil {
			t.Fatal(err)
		}
		defer w.Abort()
		_, err = p.Pull(ctx, src, w, nil)
		if err == nil || !strings.Contains(err.Error(), "not a valid gzip archive") {
			t.Fatalf("error = %v", err)
		}
	})

	t.Run("gzip layer without compression field", func(t *testing.T) {
		content := devregistry.DiskContent(1<<20, 3)
		src, _ := publish(t, reg, "dib/gz-unmarked", content, true, nil)
		src.Compression, src.Size = "", 0
		_, err := p.Pull(ctx, src, &memDest{}, nil)
		verifyError(t, err, WhatSHA256)
		if !strings.Contains(err.Error(), "media type") {
			t.Errorf("error %q gives no hint about the gzip media type", err)
		}
	})

	t.Run("two layers", func(t *testing.T) {
		repo, _ := reg.Repository("dib/two-layers")
		var layers []ocispec.Descriptor
		for _, b := range [][]byte{[]byte("one"), []byte("two")} {
			d, err := oras.PushBytes(ctx, repo, ocispec.MediaTypeImageLayer, b)
			if err != nil {
				t.Fatal(err)
			}
			layers = append(layers, d)
		}
		m, err := oras.PackManifest(ctx, repo, oras.PackManifestVersion1_1, devregistry.ArtifactType, oras.PackManifestOptions{Layers: layers})
		if err != nil {
			t.Fatal(err)
		}
		if err := repo.Tag(ctx, m, "1.0"); err != nil {
			t.Fatal(err)
		}
		_, err = p.Pull(ctx, Source{URI: "oci://" + reg.Host + "/dib/two-layers:1.0", SHA256: osimage.SHA256(strings.Repeat("0", 64))}, &memDest{}, nil)
		if err == nil || !strings.Contains(err.Error(), "2 layers") || !strings.Contains(err.Error(), "exactly one") {
			t.Fatalf("error = %v", err)
		}
	})

	t.Run("missing tag", func(t *testing.T) {
		_, err := p.Pull(ctx, Source{URI: "oci://" + reg.Host + "/dib/nothing:1.0", SHA256: osimage.SHA256(strings.Repeat("0", 64))}, &memDest{}, nil)
		if err == nil || !strings.Contains(err.Error(), "dib/nothing:1.0") {
			t.Fatalf("error = %v", err)
		}
	})

	t.Run("bad sources", func(t *testing.T) {
		sha := strings.Repeat("0", 64)
		for _, tc := range []struct {
			src  Source
			want string
		}{
			{Source{URI: "oci://x/y:1"}, "no sha256"},
			{Source{URI: "oci://x/y:1", SHA256: osimage.SHA256(sha), MD5: "xyz"}, "32 lowercase hex"},
			{Source{URI: "oci://x/y:1", SHA256: osimage.SHA256(sha), Compression: "xz"}, `compression "xz"`},
			{Source{URI: "ftp://x/y", SHA256: osimage.SHA256(sha)}, "oci://, http:// or https://"},
			{Source{URI: "oci://x/y", SHA256: osimage.SHA256(sha)}, "no tag or digest"},
		} {
			_, err := p.Pull(ctx, tc.src, &memDest{}, nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), tc.src.URI) {
				t.Errorf("Pull(%+v) = %v, want an error with %q naming the URI", tc.src, err, tc.want)
			}
		}
		if _, _, err := p.PullInto(ctx, openStore(t), "../x", Source{URI: "oci://x/y:1", SHA256: osimage.SHA256(sha)}, nil); err == nil || !strings.Contains(err.Error(), "filename") {
			t.Errorf("PullInto with filename ../x = %v", err)
		}
	})
}

// failingDest fails once it has received limit bytes.
type failingDest struct {
	n, limit int
}

func (f *failingDest) Write(p []byte) (int, error) {
	if f.n+len(p) > f.limit {
		return 0, errors.New("no space left on device")
	}
	f.n += len(p)
	return len(p), nil
}

func (f *failingDest) Reset() error { f.n = 0; return nil }

func TestPullStopsWhenTheDestinationFails(t *testing.T) {
	reg := newRegistry(t, devregistry.Options{})
	src, _ := publish(t, reg, "dib/nospace", devregistry.DiskContent(16<<20, 91), false, nil)
	res, err := fastPuller(ociClient(t, oci.Options{Insecure: true})).Pull(context.Background(), src, &failingDest{limit: 1 << 20}, nil)
	if err == nil || !strings.Contains(err.Error(), "writing the image: no space left on device") {
		t.Fatalf("error = %v", err)
	}
	if res.NetworkBytes >= src.ArchiveSize {
		t.Errorf("downloaded all %d bytes although the destination failed at 1 MiB", res.NetworkBytes)
	}
}

func TestPullCancel(t *testing.T) {
	content := devregistry.DiskContent(2<<20, 1)
	url := newQuietServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", fmt.Sprint(len(content)))
		w.Write(content[:1<<20])
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})) + "/img"
	ctx, cancel := context.WithCancel(context.Background())
	var once sync.Once
	done := make(chan error, 1)
	go func() {
		_, err := fastPuller(nil).withHTTP().Pull(ctx, Source{URI: url, SHA256: shaHex(content)}, &memDest{}, func(received, _ int64) {
			if received >= 1<<20 {
				once.Do(cancel)
			}
		})
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("error = %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Pull did not return after cancel")
	}
}

func TestPullHTTPServerMisbehaviour(t *testing.T) {
	content := devregistry.DiskContent(1<<20, 99)
	src := Source{SHA256: shaHex(content), Size: int64(len(content))}

	t.Run("longer than announced", func(t *testing.T) {
		src := src
		src.URI = newQuietServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Write(content) // chunked: no Content-Length to catch it early
			w.(http.Flusher).Flush()
			w.Write([]byte("trailing junk"))
		})) + "/img"
		_, err := fastPuller(nil).withHTTP().Pull(context.Background(), src, &memDest{}, nil)
		verifyError(t, err, WhatDownloadSize)
	})

	t.Run("Content-Length differs", func(t *testing.T) {
		src := src
		src.URI = newQuietServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Write(content[:1000])
		})) + "/img"
		_, err := fastPuller(nil).withHTTP().Pull(context.Background(), src, &memDest{}, nil)
		v := verifyError(t, err, WhatDownloadSize)
		if v.Expected != fmt.Sprint(len(content)) || !strings.HasPrefix(v.Actual, "1000 ") {
			t.Errorf("VerifyError = %+v", v)
		}
	})

	t.Run("compressed on the fly", func(t *testing.T) {
		src := src
		src.URI = newQuietServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Encoding", "gzip")
			w.Write(content)
		})) + "/img"
		_, err := fastPuller(nil).withHTTP().Pull(context.Background(), src, &memDest{}, nil)
		if err == nil || !strings.Contains(err.Error(), `Content-Encoding "gzip"`) {
			t.Fatalf("error = %v", err)
		}
	})

	t.Run("password kept out of errors", func(t *testing.T) {
		srv := newQuietServer(t, http.NotFoundHandler())
		src := src
		src.URI = strings.Replace(srv, "http://", "http://user:s3cret@", 1) + "/img"
		_, err := fastPuller(nil).withHTTP().Pull(context.Background(), src, &memDest{}, nil)
		if err == nil || strings.Contains(err.Error(), "s3cret") || !strings.Contains(err.Error(), "404") {
			t.Fatalf("error = %v", err)
		}
	})
}

// bearerOnly makes the registry demand, for reads, a bearer token scoped to
// the repository read, the way Docker Hub or Harbor do. Its challenge names
// no scope, so the client must send the repository's pull scope itself.
func bearerOnly(realm *string, on *atomic.Bool) func(http.Handler) http.Handler {
	v2 := regexp.MustCompile(`^/v2/(.+)/(manifests|blobs)/[^/]+$`)
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			m := v2.FindStringSubmatch(r.URL.Path)
			if on.Load() && m != nil && (r.Method == http.MethodGet || r.Method == http.MethodHead) &&
				r.Header.Get("Authorization") != "Bearer token-for:repository:"+m[1]+":pull" {
				w.Header().Set("WWW-Authenticate", fmt.Sprintf(`Bearer realm=%q,service="devregistry"`, *realm))
				http.Error(w, "token required", http.StatusUnauthorized)
				return
			}
			next.ServeHTTP(w, r)
		})
	}
}

func TestPullWithBearerTokens(t *testing.T) {
	var realm string
	var on atomic.Bool
	reg := registryWith(t, bearerOnly(&realm, &on))
	realm = newQuietServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, `{"token":%q}`, "token-for:"+strings.Join(r.URL.Query()["scope"], " "))
	})) + "/token"
	content := devregistry.DiskContent(1<<20, 7)
	src, _ := publish(t, reg, "dib/tokens", content, true, nil)
	on.Store(true)
	store := openStore(t)
	if _, _, err := fastPuller(ociClient(t, oci.Options{Insecure: true})).PullInto(context.Background(), store, "img.raw", src, nil); err != nil {
		t.Fatal(err)
	}
	assertStored(t, store, content)
}

// TestPullFollowsRedirectsAfresh has the registry redirect blob GETs to a
// CDN with a one-time signature, as registries on object storage do. The
// CDN cuts the first transfer: the resume must go through the registry
// again for a fresh redirect, and carry its closed range to the CDN.
func TestPullFollowsRedirectsAfresh(t *testing.T) {
	var layer atomic.Value
	var cdn string
	var redirects atomic.Int32
	reg := registryWith(t, func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			d, _ := layer.Load().(string)
			if isBlobGet(r, d) {
				http.Redirect(w, r, fmt.Sprintf("%s/blob?sig=%d", cdn, redirects.Add(1)), http.StatusTemporaryRedirect)
				return
			}
			next.ServeHTTP(w, r)
		})
	})
	content := devregistry.DiskContent(6<<20, 17)
	src, pub := publish(t, reg, "dib/cdn", content, true, nil)
	repo, _ := reg.Repository("dib/cdn")
	blob, err := readLayer(repo, pub)
	if err != nil {
		t.Fatal(err)
	}

	g, sent := &rangeGuard{}, &atomic.Int64{}
	var used sync.Map
	var first atomic.Bool
	first.Store(true)
	cdn = newQuietServer(t, g.wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, again := used.LoadOrStore(r.URL.Query().Get("sig"), true); again {
			http.Error(w, "signature already used", http.StatusForbidden)
			return
		}
		w = countingWriter{w, sent}
		if first.Swap(false) {
			w.Header().Set("Content-Length", fmt.Sprint(len(blob)))
			w.Write(blob[:512<<10])
			w.(http.Flusher).Flush()
			panic(http.ErrAbortHandler)
		}
		http.ServeContent(w, r, "blob", time.Time{}, bytes.NewReader(blob))
	})))
	layer.Store(pub.LayerDigest.String())

	store := openStore(t)
	_, res, err := fastPuller(ociClient(t, oci.Options{Insecure: true})).PullInto(context.Background(), store, "img.raw", src, nil)
	if err != nil {
		t.Fatal(err)
	}
	assertStored(t, store, content)
	if redirects.Load() != 2 || res.Resumes != 1 || res.Restarts != 0 {
		t.Errorf("%d redirects, %d resumes, %d restarts; want 2, 1, 0", redirects.Load(), res.Resumes, res.Restarts)
	}
	if r := g.seen(); len(r) != 1 || r[0] != fmt.Sprintf("bytes=%d-%d", 512<<10, len(blob)-1) {
		t.Errorf("ranges at the CDN: %q", r)
	}
	if sent.Load() != int64(len(blob)) {
		t.Errorf("the CDN sent %d bytes for a %d-byte blob", sent.Load(), len(blob))
	}
}

// content2 reads the layer of pub back from repo.
func readLayer(repo *remote.Repository, pub devregistry.Published) ([]byte, error) {
	desc, err := repo.Blobs().Resolve(context.Background(), pub.LayerDigest.String())
	if err != nil {
		return nil, err
	}
	return content.FetchAll(context.Background(), repo.Blobs(), desc)
}
