package fill

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/md5"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sylva-projects/osimages/internal/imagestore"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/pull"
	"github.com/sylva-projects/osimages/internal/servedset"
)

// dyingServer sends the first half of body, then cuts the connection, and
// refuses every request after (a peer killed half way). It counts what it
// sent in sent.
func dyingServer(t *testing.T, body []byte, sent *atomic.Int64) *httptest.Server {
	var died atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if died.Load() {
			http.Error(w, "gone", http.StatusServiceUnavailable)
			return
		}
		died.Store(true)
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		n, _ := w.Write(body[:len(body)/2])
		sent.Add(int64(n))
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// rangeServer serves body with ranges, counting what it sent.
func rangeServer(t *testing.T, body []byte, sent *atomic.Int64) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.ServeContent(&countingWriter{ResponseWriter: w, n: sent}, r, "blob", time.Time{}, bytes.NewReader(body))
	}))
	t.Cleanup(srv.Close)
	return srv
}

type countingWriter struct {
	http.ResponseWriter
	n *atomic.Int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.ResponseWriter.Write(p)
	c.n.Add(int64(n))
	return n, err
}

// TestChainContinuesWhatAFailedSourceKept: a source that dies half way
// through (the origin peer killed) leaves its bytes, checkpointed, and the
// next source of the same bytes (the registry) continues from there with a
// range rather than from byte 0; a reader of the compressed layer in
// progress (a peer that follows this replica) reads on through the change
// of source to the whole layer. Before, the chain reset the writer: the
// registry sent the whole layer again.
func TestChainContinuesWhatAFailedSourceKept(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	image := make([]byte, 8<<20)
	for i := range image {
		// Compressible, not trivially: a gzip layer about half the image.
		image[i] = byte(r.IntN(16))
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(image)
	zw.Close()
	for _, tc := range []struct {
		name, compression string
		network           []byte
	}{{"raw", "", image}, {"gzip layer", "gz", gz.Bytes()}} {
		t.Run(tc.name, func(t *testing.T) {
			sum := sha256.Sum256(image)
			m := md5.Sum(image)
			blob := sha256.Sum256(tc.network)
			sha := osimage.SHA256(hex.EncodeToString(sum[:]))
			st, err := imagestore.Open(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { st.Close() })
			dst, err := st.Resume(sha)
			if err != nil {
				t.Fatal(err)
			}
			defer dst.Abort()
			var peerSent, registrySent atomic.Int64
			peer, registry := dyingServer(t, tc.network, &peerSent), rangeServer(t, tc.network, &registrySent)
			source := func(name, url string) Func {
				puller := &pull.Puller{HTTP: http.DefaultClient, MaxRetries: 1, Backoff: time.Millisecond, MaxBackoff: time.Millisecond}
				return Func{Label: name, F: func(ctx context.Context, w servedset.Wanted, dst *imagestore.Writer, progress pull.Progress) (pull.Result, error) {
					src := pull.Source{URI: url, SHA256: sha, MD5: hex.EncodeToString(m[:]), Size: int64(len(image)), Compression: tc.compression}
					if tc.compression != "" {
						src.BlobDigest, src.ArchiveSize = "sha256:"+hex.EncodeToString(blob[:]), int64(len(tc.network))
					}
					return puller.Pull(ctx, src, dst, progress)
				}}
			}
			// A follower of this replica's layer, from its first byte.
			followed := make(chan []byte, 1)
			var l log
			c := chain(&l, source("registry", registry.URL), source("peer origin", peer.URL))
			if tc.compression != "" {
				c.Started = func(_ servedset.Wanted, src Source) {
					l.add("start %s", src.Name())
					if src.Name() != "peer origin" {
						return
					}
					go func() {
						for {
							if _, ok := dst.Blob(); ok {
								break
							}
							time.Sleep(time.Millisecond)
						}
						tail, err := dst.TailBlob(context.Background(), 0)
						if err != nil {
							t.Error(err)
							followed <- nil
							return
						}
						defer tail.Close()
						b, err := io.ReadAll(tail)
						if err != nil {
							t.Errorf("the follower of the layer was cut at %d bytes: %v", len(b), err)
						}
						followed <- b
					}()
				}
			}
			res, from, err := c.Fill(context.Background(), servedset.Wanted{SHA256: sha, Key: "k"}, dst, func(int64, int64) {})
			if err != nil || from != "registry" {
				t.Fatalf("filled from %q: %v (%s)", from, err, l.String())
			}
			half := int64(len(tc.network) / 2)
			t.Logf("the origin sent %d bytes, the registry %d, of %d; kept %d", peerSent.Load(), registrySent.Load(), len(tc.network), res.Kept)
			if res.Kept == 0 || registrySent.Load() > int64(len(tc.network))-res.Kept+64<<10 || res.Kept > half {
				t.Errorf("the registry sent %d bytes of %d after the origin sent %d (kept %d): want only what was not kept", registrySent.Load(), len(tc.network), peerSent.Load(), res.Kept)
			}
			if err := dst.Commit(imagestore.Entry{SHA256: sha, MD5: res.MD5, Filename: "disk.raw", Size: res.Size}); err != nil {
				t.Fatal(err)
			}
			f, _, err := st.Open(sha)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			got, _ := io.ReadAll(f)
			if !bytes.Equal(got, image) {
				t.Fatal("the stored image differs")
			}
			if tc.compression != "" {
				if b := <-followed; !bytes.Equal(b, tc.network) {
					t.Errorf("the follower read %d bytes of the layer, not the layer's %d", len(b), len(tc.network))
				}
			}
		})
	}
}
