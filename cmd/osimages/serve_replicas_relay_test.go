package main

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sylva-projects/osimages/internal/devregistry"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/replica"
	"github.com/sylva-projects/osimages/internal/testenv"
)

// flipped is a body of the right length and wrong bytes.
type flipped struct{ io.ReadCloser }

func (f flipped) Read(p []byte) (int, error) {
	n, err := f.ReadCloser.Read(p)
	for i := range p[:n] {
		p[i] ^= 0xff
	}
	return n, err
}

// TestServeReplicasAnswerRangesOnlyFromTheirOwnCopy: a peer whose state
// says it holds the images verified lies to every relayed request (the
// right length, every byte flipped). A replica still filling an image
// holds a client's ranges (bytes=0-4095, a suffix, several ranges,
// If-Range) until its own copy is verified and answers them from it: no
// byte of the liar, and the liar is not asked for them. A whole GET
// relayed from the liar is cut before its last byte, and the liar is not
// asked again for that image.
func TestServeReplicasAnswerRangesOnlyFromTheirOwnCopy(t *testing.T) {
	registryGate := newStallGate(t)
	reg := testenv.Registry(t, devregistry.Options{Middleware: func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			registryGate.hold(r, !strings.Contains(r.URL.Path, "/blobs/"))
			next.ServeHTTP(w, r)
		})
	}})
	args, sums, _ := replicaImages(t, reg, 3<<20)
	sum := sums[0]
	var name string
	for _, p := range publishedFor(t, reg) {
		if imageSHA(t, p) == sum {
			name = p.Fields.Get(osimage.FieldFilename)
		}
	}
	// a's peer listener: relayed requests get flipped bytes; fills wait
	// for release.
	var relayed, fills atomic.Int64
	var gated atomic.Bool
	release := make(chan struct{})
	var releaseOnce sync.Once
	open := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(open)
	advertise := func(peerAddr string) string {
		target, _ := url.Parse("http://" + peerAddr)
		proxy := httputil.NewSingleHostReverseProxy(target)
		proxy.ModifyResponse = func(resp *http.Response) error {
			if resp.Request.Header.Get(replica.RelayHeader) != "" {
				resp.Body = flipped{resp.Body}
			}
			return nil
		}
		addr := testenv.FreePeerAddr(t)
		srv := &http.Server{Addr: addr, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			switch {
			case r.URL.Path == replica.StatePath:
			case r.Header.Get(replica.RelayHeader) != "":
				relayed.Add(1)
			case gated.Load():
				fills.Add(1)
				select {
				case <-release:
				case <-r.Context().Done():
					return
				}
			}
			proxy.ServeHTTP(w, r)
		})}
		go srv.ListenAndServe()
		t.Cleanup(func() { srv.Close() })
		return addr
	}
	rs := newReplicaSet(t, args...)
	a := rs.start("a", advertise)
	testenv.Eventually(t, "a holds both images", 60*time.Second, func() (bool, string) {
		return a.holds(sums...), fmt.Sprint(a.state()) + a.d.stderr.String()
	})
	imagePath := osimage.ImagePath(sum, name)
	data := []byte(httpGet(t, a.d.url(imagePath)))
	registryGate.closed.Store(true)
	gated.Store(true)
	hold := 20 * time.Second
	b := rs.start("b", nil, "--client-hold", hold.String(), "--peer-timeout", "60s")
	testenv.Eventually(t, "b fills the image from a, held", 60*time.Second, func() (bool, string) {
		st := b.state()
		return st != nil && st.Images[sum].FillsFromPeer() && fills.Load() > 0, fmt.Sprint(st)
	})

	type probe struct {
		header  map[string]string
		status  int
		want    [][]byte
		got     []byte
		gotCode int
		err     error
	}
	probes := []*probe{
		{header: map[string]string{"Range": "bytes=0-4095"}, status: http.StatusPartialContent, want: [][]byte{data[:4096]}},
		{header: map[string]string{"Range": "bytes=-4096"}, status: http.StatusPartialContent, want: [][]byte{data[len(data)-4096:]}},
		{header: map[string]string{"Range": "bytes=0-99,1000-1099"}, status: http.StatusPartialContent, want: [][]byte{data[:100], data[1000:1100]}},
		{header: map[string]string{"Range": "bytes=0-4095", "If-Range": `"` + string(sum) + `"`}, status: http.StatusPartialContent, want: [][]byte{data[:4096]}},
	}
	var wg sync.WaitGroup
	for _, p := range probes {
		sent := make(chan struct{})
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest(http.MethodGet, b.d.url(imagePath), nil)
			for k, v := range p.header {
				req.Header.Set(k, v)
			}
			req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{WroteRequest: func(httptrace.WroteRequestInfo) { close(sent) }}))
			resp, err := (&http.Client{Timeout: 2 * hold}).Do(req)
			if err != nil {
				p.err = err
				return
			}
			defer resp.Body.Close()
			p.gotCode = resp.StatusCode
			p.got, p.err = io.ReadAll(resp.Body)
		}()
		<-sent
	}
	// A whole GET is relayed from the liar, and cut before its last byte.
	resp, err := http.Get(b.d.url(imagePath))
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode == http.StatusOK && (err == nil || len(body) >= len(data)) {
		t.Fatalf("whole GET relayed from a liar: %s, %v, %d of %d bytes; want it cut before its end", resp.Status, err, len(body), len(data))
	}
	// The copy of b is then verified: the ranges held get its bytes.
	open()
	wg.Wait()
	flippedStart := bytes.Clone(data[:64])
	for i := range flippedStart {
		flippedStart[i] ^= 0xff
	}
	for _, p := range probes {
		if p.err != nil || p.gotCode != p.status {
			t.Fatalf("%v of b while it fills the image: %d, %v; want %d from its own copy once verified", p.header, p.gotCode, p.err, p.status)
		}
		for _, want := range p.want {
			if !bytes.Contains(p.got, want) {
				t.Fatalf("%v of b: the answer lacks bytes of the image: %d bytes", p.header, len(p.got))
			}
		}
		if bytes.Contains(p.got, flippedStart[:16]) {
			t.Fatalf("%v of b: the answer holds the liar's bytes", p.header)
		}
	}
	if n := relayed.Load(); n != 1 {
		t.Fatalf("the liar was asked %d times for relays, want once: the whole GET, never a range", n)
	}
	if got := httpGet(t, b.d.url(imagePath)); got != string(data) {
		t.Fatalf("GET of b once it holds the image: %d bytes, not the image", len(got))
	}
}
