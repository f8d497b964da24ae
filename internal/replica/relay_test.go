package replica

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sylva-projects/osimages/internal/fill"
	"github.com/sylva-projects/osimages/internal/imagelife"
	"github.com/sylva-projects/osimages/internal/osimage"
)

// relayClient starts a client-facing server on a real socket that answers
// every image request through a Relay over v, 503 when it cannot.
func relayClient(t *testing.T, v *View, sum osimage.SHA256) string {
	t.Helper()
	return relayWith(t, Relay{View: v}, sum)
}

// relayWith is relayClient with relay, its Client and SendTimeout set.
func relayWith(t *testing.T, relay Relay, sum osimage.SHA256) string {
	t.Helper()
	relay.Client, relay.SendTimeout = &http.Client{Transport: Transport()}, time.Minute
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !relay.Serve(w, r, sum, "disk.raw") {
			w.Header().Set("Retry-After", "30")
			http.Error(w, "no peer holds it verified", http.StatusServiceUnavailable)
		}
	}))
	t.Cleanup(srv.Close)
	return srv.URL + osimage.ImagePath(sum, "disk.raw")
}

// viewOf reads the states of peers once, as the replica "self".
func viewOf(t *testing.T, peers ...Peer) *View {
	t.Helper()
	v := NewView(&replicas{self: "self", selfReady: true, ready: peers}, nil, nil, ClaimRule{})
	v.readAll(context.Background())
	return v
}

func get(t *testing.T, method, url, rng string) (*http.Response, []byte, error) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if rng != "" {
		req.Header.Set("Range", rng)
	}
	// A relay that passed a download in progress would wait for its
	// next bytes for ever: the bound makes that a failure, not a hang.
	c := http.Client{Timeout: time.Minute}
	resp, err := c.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp, body, err
}

// TestRelayPassesAPeersVerifiedCopy: a client of a replica that does not
// hold the image gets the verified copy of the peer that does, whole, as
// a HEAD (its length, as Ironic's conductor reads it) and in ranges.
func TestRelayPassesAPeersVerifiedCopy(t *testing.T) {
	img := newImage(t, 300<<10, 11)
	h := newHolder(t, img)
	h.storeVerified(t)
	peer, _ := serve(t, "origin", h, time.Second)
	v := viewOf(t, peer)
	if got := v.Holders(img.w.SHA256); len(got) != 1 || got[0].ID != "origin" {
		t.Fatalf("Holders = %v, want the origin", got)
	}
	url := relayClient(t, v, img.w.SHA256)

	resp, body, err := get(t, http.MethodGet, url, "")
	if err != nil || resp.StatusCode != http.StatusOK || string(body) != string(img.data) {
		t.Fatalf("GET through the relay: %v, %v, %d bytes; want 200 and the image", err, resp, len(body))
	}
	resp, _, err = get(t, http.MethodHead, url, "")
	if err != nil || resp.StatusCode != http.StatusOK || resp.ContentLength != int64(len(img.data)) {
		t.Fatalf("HEAD through the relay: %v, %v; want 200 with Content-Length %d", err, resp, len(img.data))
	}
}

// statusLie says the image is verified while the holder only pulls it.
type statusLie struct{ *holder }

func (s statusLie) State() State {
	st := s.holder.State()
	for sum, img := range st.Images {
		img.Phase = imagelife.PhaseReady
		st.Images[sum] = img
	}
	return st
}

// TestRelayNeverPassesADownloadInProgress: a peer whose state says it
// holds the image, but which answers with its registry pull in progress
// (its state was read before it dropped its copy, say), is refused before
// any byte reaches the client; one whose state says it pulls is not asked.
func TestRelayNeverPassesADownloadInProgress(t *testing.T) {
	img := newImage(t, 64<<10, 12)
	h := newHolder(t, img)
	write := h.startDownload(t)
	write(32 << 10)

	honest, _ := serve(t, "origin", h, time.Second)
	if got := viewOf(t, honest).Holders(img.w.SHA256); len(got) != 0 {
		t.Fatalf("Holders = %v of a peer that pulls the image, want none", got)
	}

	lying, _ := serve(t, "origin", statusLie{h}, time.Second)
	url := relayClient(t, viewOf(t, lying), img.w.SHA256)
	resp, body, err := get(t, http.MethodGet, url, "")
	if err != nil || resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get(InProgressHeader) != "" {
		t.Fatalf("GET through the relay of a download in progress: %v, %v, %q; want the client's 503 and no byte of the download", err, resp, body)
	}
}

// TestRelayCutsACopyThatIsNotTheImage: a peer that sends other bytes than
// the image (a disk that rotted since it verified it) gets the client's
// download cut before its last byte, so that no client holds a whole
// image that is not the one it asked for.
func TestRelayCutsACopyThatIsNotTheImage(t *testing.T) {
	img := newImage(t, 200<<10, 13)
	h := newHolder(t, img)
	h.storeVerified(t)
	h.lie = append([]byte(nil), img.data...)
	h.lie[len(h.lie)/2] ^= 0xff
	peer, _ := serve(t, "origin", h, time.Second)
	url := relayClient(t, viewOf(t, peer), img.w.SHA256)

	resp, body, err := get(t, http.MethodGet, url, "")
	if err == nil || !errors.Is(err, io.ErrUnexpectedEOF) || len(body) >= len(img.data) {
		t.Fatalf("GET through the relay of a copy that is not the image: %v, %v, %d of %d bytes; want the download cut before its end", err, resp, len(body), len(img.data))
	}
}

// hostile serves the state of h (a holder of the image verified) on a
// real socket, and answers its image requests with image; it counts them.
func hostile(t *testing.T, id string, h *holder, image http.HandlerFunc) (Peer, *atomic.Int64) {
	t.Helper()
	real := Endpoints{Holder: h, Wait: time.Second, SendTimeout: time.Minute}.Handler()
	var asked atomic.Int64
	done := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == StatePath {
			real.ServeHTTP(w, r)
			return
		}
		asked.Add(1)
		image(w, r.WithContext(stopOn(r.Context(), done)))
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(done) })
	return Peer{ID: id, URL: srv.URL}, &asked
}

// stopOn is ctx, ended as well when done is closed.
func stopOn(ctx context.Context, done <-chan struct{}) context.Context {
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-done:
		case <-ctx.Done():
		}
		cancel()
	}()
	return ctx
}

// sendThenStall answers 200 with length announced, sends body a byte
// every every (all at once when 0), then holds the answer open.
func sendThenStall(length int, body []byte, every time.Duration) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(length))
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		for i := 0; i < len(body); {
			n := len(body) - i
			if every > 0 {
				n = 1
			}
			if _, err := w.Write(body[i : i+n]); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			i += n
			if every > 0 {
				select {
				case <-time.After(every):
				case <-r.Context().Done():
					return
				}
			}
		}
		<-r.Context().Done()
	}
}

// TestRelayNeverPassesARange: a peer whose state says it holds the image
// verified, and which answers every request with the right length of
// wrong bytes, gets none of its bytes to a client that asks for a range
// or asks conditionally: such requests are not relayed at all (the
// client's server answers them from its own copy, once verified), and the
// peer is not even asked. A whole GET is cut before its last byte.
func TestRelayNeverPassesARange(t *testing.T) {
	img := newImage(t, 256<<10, 21)
	h := newHolder(t, img)
	h.storeVerified(t)
	h.lie = bytes.Clone(img.data)
	for i := range h.lie[:8192] {
		h.lie[i] ^= 0x5a
	}
	h.lie[len(h.lie)-1] ^= 0x5a
	peer, asked := hostile(t, "origin", h, func(w http.ResponseWriter, r *http.Request) { h.ServeStored(w, r, img.w.SHA256) })
	url := relayClient(t, viewOf(t, peer), img.w.SHA256)

	for _, hdr := range []map[string]string{
		{"Range": "bytes=0-4095"},
		{"Range": "bytes=-4096"},
		{"Range": "bytes=4096-"},
		{"Range": "bytes=0-0,100-199"},
		{"Range": "bytes=0-4095", "If-Range": `"` + string(img.w.SHA256) + `"`},
		{"If-Range": `"` + string(img.w.SHA256) + `"`},
		{"If-None-Match": `"other"`},
		{"If-Modified-Since": time.Unix(0, 0).UTC().Format(http.TimeFormat)},
	} {
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := (&http.Client{Timeout: time.Minute}).Do(req)
		if err != nil {
			t.Fatalf("%v: %v", hdr, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable || bytes.Contains(body, h.lie[:16]) {
			t.Fatalf("%v through the relay of a lying peer: %s, %d bytes; want the client's 503, no byte of the peer", hdr, resp.Status, len(body))
		}
	}
	if n := asked.Load(); n != 0 {
		t.Fatalf("the peer was asked %d times for ranges or conditionally, want never", n)
	}
	resp, body, err := get(t, http.MethodGet, url, "")
	if err == nil || len(body) >= len(img.data) {
		t.Fatalf("whole GET through the relay of a lying peer: %v, %v, %d of %d bytes; want the download cut before its end", err, resp, len(body), len(img.data))
	}
}

// TestRelayRefusesALengthThatIsNotTheImages: a peer that announces
// another length than the declared size is refused before any byte or
// header of it reaches the client, for a HEAD as for a GET.
func TestRelayRefusesALengthThatIsNotTheImages(t *testing.T) {
	img := newImage(t, 128<<10, 22)
	h := newHolder(t, img)
	h.storeVerified(t)
	longer := append(bytes.Clone(img.data), make([]byte, 4096)...)
	peer, asked := hostile(t, "origin", h, func(w http.ResponseWriter, r *http.Request) {
		http.ServeContent(w, r, "disk.raw", time.Time{}, bytes.NewReader(longer))
	})
	size := func(osimage.SHA256) int64 { return int64(len(img.data)) }
	url := relayWith(t, Relay{View: viewOf(t, peer), Size: size, Failures: &Failures{}}, img.w.SHA256)
	for _, method := range []string{http.MethodHead, http.MethodGet} {
		resp, _, err := get(t, method, url, "")
		if err != nil || resp.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("%s through the relay of a peer that announces %d bytes of an image of %d: %v, %v; want the client's 503", method, len(longer), len(img.data), err, resp)
		}
	}
	if asked.Load() != 1 {
		t.Fatalf("the peer was asked %d times, want once: then it failed the image", asked.Load())
	}
}

// TestRelayIsBoundedByTheHoldAndTheStall: a peer that does not begin its
// answer keeps a client no longer than the relay's Hold, and is asked
// again later (the end of a hold is not its fault); one that stalls after
// its headers is cut by Stall, one that trickles by MinRate, and neither
// is asked again for the image.
func TestRelayIsBoundedByTheHoldAndTheStall(t *testing.T) {
	img := newImage(t, 128<<10, 23)
	h := newHolder(t, img)
	h.storeVerified(t)
	silent := func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() }
	for _, tc := range []struct {
		name  string
		peer  http.HandlerFunc
		relay Relay
		bound time.Duration
		again bool
	}{
		{"does not answer, cut by the hold", silent, Relay{Hold: time.Second}, time.Second, true},
		{"stalls after its headers, cut by the stall", sendThenStall(len(img.data), img.data[:1000], 0),
			Relay{Hold: 100 * time.Millisecond, Rule: fill.Rule{Stall: 500 * time.Millisecond}}, 500*time.Millisecond + relayPoll, false},
		{"trickles, cut by the min rate", sendThenStall(len(img.data), img.data[:1000], 50*time.Millisecond),
			Relay{Hold: 100 * time.Millisecond, Rule: fill.Rule{Stall: time.Hour, MinRate: 1 << 10, RateWindow: time.Second}}, time.Second + relayPoll, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			peer, asked := hostile(t, "origin", h, tc.peer)
			relay := tc.relay
			relay.View, relay.Failures = viewOf(t, peer), &Failures{}
			url := relayWith(t, relay, img.w.SHA256)
			start := time.Now()
			resp, body, err := get(t, http.MethodGet, url, "")
			took := time.Since(start)
			if tc.again {
				if err != nil || resp.StatusCode != http.StatusServiceUnavailable {
					t.Fatalf("GET through a relay from a peer that %s: %v, %v; want the client's 503", tc.name, err, resp)
				}
			} else if err == nil || len(body) >= len(img.data) {
				t.Fatalf("GET through a relay from a peer that %s: %v, %v, %d bytes; want the download cut", tc.name, err, resp, len(body))
			}
			// The bound, and the time a busy machine may take on top.
			if took > tc.bound+5*time.Second {
				t.Fatalf("the relay took %s, want it cut after %s", took, tc.bound)
			}
			resp, _, err = get(t, http.MethodGet, url, "")
			if tc.again {
				if err != nil || resp.StatusCode != http.StatusServiceUnavailable || asked.Load() != 2 {
					t.Fatalf("after a relay cut by the hold: %v, %v, the peer asked %d times; want it asked again", err, resp, asked.Load())
				}
				return
			}
			if err != nil || resp.StatusCode != http.StatusServiceUnavailable || asked.Load() != 1 {
				t.Fatalf("after the peer failed: %v, %v, the peer asked %d times; want the client's 503 and no second try", err, resp, asked.Load())
			}
		})
	}
}

// TestRelayOutlastsTheHoldWhileBytesFlow: the hold bounds the wait for a
// peer's answer, not the download: a peer that streams a many-GiB image
// for minutes, steadily, gets it to the client whole. Here the stream
// lasts about 16 times the hold.
func TestRelayOutlastsTheHoldWhileBytesFlow(t *testing.T) {
	img := newImage(t, 128<<10, 29)
	h := newHolder(t, img)
	h.storeVerified(t)
	const chunks = 16
	hold := 100 * time.Millisecond
	steady := func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(len(img.data)))
		w.WriteHeader(http.StatusOK)
		step := len(img.data) / chunks
		for i := 0; i < len(img.data); i += step {
			if _, err := w.Write(img.data[i:min(i+step, len(img.data))]); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			select {
			case <-time.After(hold):
			case <-r.Context().Done():
				return
			}
		}
	}
	peer, _ := hostile(t, "origin", h, steady)
	url := relayWith(t, Relay{View: viewOf(t, peer), Hold: hold, Rule: fill.Rule{Stall: time.Minute, MinRate: 1 << 10, RateWindow: time.Second}, Failures: &Failures{}}, img.w.SHA256)
	start := time.Now()
	resp, body, err := get(t, http.MethodGet, url, "")
	if err != nil || resp.StatusCode != http.StatusOK || !bytes.Equal(body, img.data) {
		t.Fatalf("GET through a relay from a steady peer, %s after it began: %v, %v, %d of %d bytes; want the whole image", time.Since(start), err, resp, len(body), len(img.data))
	}
	if took := time.Since(start); took < chunks*hold/2 {
		t.Fatalf("the relay took %s: the peer was meant to stream for about %s", took, chunks*hold)
	}
}

// TestRelayGoesOnFromTheCopyVerifiedHere: a relay whose peer stalls
// mid-body goes on, as soon as this replica holds the image verified,
// from that copy at the offset reached; the whole is still hashed, so a
// peer that sent wrong bytes before it stalled gets the download cut.
func TestRelayGoesOnFromTheCopyVerifiedHere(t *testing.T) {
	img := newImage(t, 512<<10, 24)
	h := newHolder(t, img)
	h.storeVerified(t)
	path := filepath.Join(t.TempDir(), "verified")
	if err := os.WriteFile(path, img.data, 0o600); err != nil {
		t.Fatal(err)
	}
	wrong := bytes.Clone(img.data[:100<<10])
	wrong[50] ^= 1
	for _, tc := range []struct {
		name string
		sent []byte
		good bool
	}{
		{"the peer's bytes are the image's", img.data[:100<<10], true},
		{"the peer's bytes are not", wrong, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			peer, _ := hostile(t, "origin", h, sendThenStall(len(img.data), tc.sent, 0))
			var verified atomic.Bool
			local := func(osimage.SHA256) (*os.File, error) {
				if !verified.Load() {
					return nil, nil
				}
				return os.Open(path)
			}
			url := relayWith(t, Relay{View: viewOf(t, peer), Hold: time.Minute, Local: local}, img.w.SHA256)
			resp, err := http.Get(url)
			if err != nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("GET through the relay: %v, %v", err, resp)
			}
			defer resp.Body.Close()
			got := make([]byte, len(tc.sent))
			if _, err := io.ReadFull(resp.Body, got); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			verified.Store(true)
			rest, err := io.ReadAll(resp.Body)
			got = append(got, rest...)
			if took := time.Since(start); took > 10*time.Second {
				t.Fatalf("the rest came %s after the copy here was verified", took)
			}
			if tc.good && (err != nil || !bytes.Equal(got, img.data)) {
				t.Fatalf("once verified here: %v, %d of %d bytes, equal %v; want the image whole", err, len(got), len(img.data), bytes.Equal(got, img.data))
			}
			if !tc.good && (err == nil || len(got) >= len(img.data)) {
				t.Fatalf("a wrong start, then the copy here: %v, %d of %d bytes; want the download cut before its end", err, len(got), len(img.data))
			}
		})
	}
}

// TestRelaySkipsAPeerThatFailedTheImage: a peer that failed a fill of the
// image (Failures, shared with the Filler) is not relayed from, until it
// runs as another instance.
func TestRelaySkipsAPeerThatFailedTheImage(t *testing.T) {
	img := newImage(t, 64<<10, 25)
	h := newHolder(t, img)
	h.storeVerified(t)
	h.instance = "first"
	peer, asked := hostile(t, "origin", h, func(w http.ResponseWriter, r *http.Request) { h.ServeStored(w, r, img.w.SHA256) })
	failures := &Failures{}
	failures.Add(img.w.SHA256, "origin", "first")
	v := viewOf(t, peer)
	relay := Relay{View: v, Failures: failures}
	if relay.Holds(img.w.SHA256) {
		t.Fatal("Holds says a peer that failed the image holds it")
	}
	url := relayWith(t, relay, img.w.SHA256)
	if resp, _, err := get(t, http.MethodGet, url, ""); err != nil || resp.StatusCode != http.StatusServiceUnavailable || asked.Load() != 0 {
		t.Fatalf("GET through the relay of a peer that failed the image: %v, %v, asked %d; want the client's 503, the peer not asked", err, resp, asked.Load())
	}
	h.instance = "second"
	v.readAll(context.Background())
	if resp, body, err := get(t, http.MethodGet, url, ""); err != nil || resp.StatusCode != http.StatusOK || !bytes.Equal(body, img.data) {
		t.Fatalf("GET through the relay once the peer runs again: %v, %v, %d bytes; want the image", err, resp, len(body))
	}
}
