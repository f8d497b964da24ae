package replica

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/sylva-projects/osimages/internal/osimage"
)

// relayClient starts a client-facing server on a real socket that answers
// every image request through a Relay over v, 503 when it cannot.
func relayClient(t *testing.T, v *View, sum osimage.SHA256) string {
	t.Helper()
	relay := Relay{View: v, Client: &http.Client{Transport: Transport()}, SendTimeout: time.Minute}
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
	resp, body, err = get(t, http.MethodGet, url, "bytes=1000-1999")
	if err != nil || resp.StatusCode != http.StatusPartialContent || string(body) != string(img.data[1000:2000]) ||
		resp.Header.Get("Content-Range") != fmt.Sprintf("bytes 1000-1999/%d", len(img.data)) {
		t.Fatalf("a range through the relay: %v, %v, %d bytes; want 206 with bytes 1000-1999", err, resp, len(body))
	}
}

// statusLie says the image is verified while the holder only pulls it.
type statusLie struct{ *holder }

func (s statusLie) State() State {
	st := s.holder.State()
	for sum, img := range st.Images {
		img.Phase = PhaseReady
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
