package replica

import (
	"crypto/sha256"
	"encoding/hex"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/sylva-projects/osimages/internal/httpsend"
	"github.com/sylva-projects/osimages/internal/osimage"
)

// InProgressHeader marks a peer's answer that streams a download in
// progress (Endpoints.serveInProgress): unverified bytes, which a Relay
// never passes to a client.
const InProgressHeader = "X-Osimages-In-Progress"

// RelayHeader marks the requests of a Relay, for the peer's logs and
// proxies: the bytes go to a client, not into a fill.
const RelayHeader = "X-Osimages-Relay"

// Holders are the peers whose state, as last read, says they hold sum
// verified: listed ones, ready or not (a copy is verified whatever the
// replica's readiness). The order is the rendezvous order of sum and
// this replica, so that replicas relaying the same image spread over its
// holders.
func (v *View) Holders(sum osimage.SHA256) []Peer {
	listed := v.replicas.Listed()
	v.mu.Lock()
	defer v.mu.Unlock()
	byID := map[string]Peer{}
	for _, p := range listed {
		if pv, ok := v.peers[p.ID]; ok && pv.err == nil && pv.state.Images[sum].Verified() {
			byID[p.ID] = p
		}
	}
	ids := make([]string, 0, len(byID))
	for id := range byID {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	out := make([]Peer, 0, len(ids))
	for _, id := range Rendezvous(string(sum)+"/"+v.replicas.Self(), ids) {
		out = append(out, byID[id])
	}
	return out
}

// Relay answers a client's request for an image this replica does not
// hold verified (it is still filling it, or dropped a copy that changed
// on disk) from a peer that holds it verified: Ironic fails a host on
// any answer but 200 and does not retry, so a replica behind the Service
// passes on a verified copy rather than answer 503.
//
// Only a peer's stored, verified file is passed on: a peer's answer that
// streams a download in progress (InProgressHeader) is refused before any
// byte reaches the client. A whole image is also hashed on the way, and
// its last byte held back until its sha256 matches: a client never gets a
// complete image that is not the one it asked for.
type Relay struct {
	View *View
	// Client reaches the peers (Transport); it needs no overall timeout:
	// SendTimeout bounds each write to the client, the peer's own
	// SendTimeout each of its writes.
	Client *http.Client
	// SendTimeout bounds one write of the answer to the client.
	SendTimeout time.Duration
	Log         *slog.Logger
}

// Holds says whether a peer holds sum verified.
func (r Relay) Holds(sum osimage.SHA256) bool { return len(r.View.Holders(sum)) > 0 }

// relayed are the headers of a peer's answer passed on to the client.
var relayed = []string{"Content-Length", "Content-Range", "Content-Type", "Accept-Ranges", "ETag", "Last-Modified"}

// Serve answers the client's GET or HEAD of image sum under name from the
// first holder that answers with its verified file. It returns false,
// having written nothing, when none does.
func (r Relay) Serve(w http.ResponseWriter, req *http.Request, sum osimage.SHA256, name string) bool {
	log := r.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	for _, p := range r.View.Holders(sum) {
		out, err := http.NewRequestWithContext(req.Context(), req.Method, p.URL+osimage.ImagePath(sum, name), nil)
		if err != nil {
			return false
		}
		for _, h := range []string{"Range", "If-Range", "If-Match", "If-None-Match", "If-Modified-Since", "If-Unmodified-Since"} {
			if v := req.Header.Get(h); v != "" {
				out.Header.Set(h, v)
			}
		}
		out.Header.Set(RelayHeader, "client")
		resp, err := r.Client.Do(out)
		if err != nil {
			log.Info("a peer could not relay an image to a client; trying the next", "peer", p.ID, "sha256", sum, "error", err.Error())
			continue
		}
		switch {
		case resp.Header.Get(InProgressHeader) != "":
			resp.Body.Close()
			log.Info("a peer answered with a download in progress, not a verified copy; trying the next", "peer", p.ID, "sha256", sum)
			continue
		case resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusPartialContent &&
			resp.StatusCode != http.StatusNotModified && resp.StatusCode != http.StatusPreconditionFailed &&
			resp.StatusCode != http.StatusRequestedRangeNotSatisfiable:
			resp.Body.Close()
			log.Info("a peer could not relay an image to a client; trying the next", "peer", p.ID, "sha256", sum, "status", resp.Status)
			continue
		}
		r.pass(w, req, resp, p, sum)
		return true
	}
	return false
}

// pass sends the peer's answer to the client. A whole image is hashed as
// it goes, its last byte sent only once the sha256 matches; a stream cut
// or that does not match cuts the client's connection, which the client
// sees as a failed download.
func (r Relay) pass(w http.ResponseWriter, req *http.Request, resp *http.Response, p Peer, sum osimage.SHA256) {
	defer resp.Body.Close()
	for _, h := range relayed {
		if v := resp.Header.Get(h); v != "" {
			w.Header().Set(h, v)
		}
	}
	w.WriteHeader(resp.StatusCode)
	switch {
	case req.Method == http.MethodHead:
		return
	case resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusPartialContent:
		// A 304, 412 or 416: no image bytes, at most a line of text.
		_, _ = io.Copy(w, io.LimitReader(resp.Body, 64<<10))
		return
	}
	length, err := strconv.ParseInt(resp.Header.Get("Content-Length"), 10, 64)
	if err != nil || length < 0 {
		panic(http.ErrAbortHandler)
	}
	dst := &httpsend.Writer{ResponseWriter: w, Timeout: r.SendTimeout}
	if resp.StatusCode == http.StatusPartialContent || length == 0 {
		// A range is the peer's verified file as it is: the client checks
		// the whole it puts together.
		if n, err := io.Copy(dst, resp.Body); err != nil || n != length {
			panic(http.ErrAbortHandler)
		}
		return
	}
	h := sha256.New()
	body := io.TeeReader(resp.Body, h)
	if n, err := io.CopyN(dst, body, length-1); err != nil || n != length-1 {
		panic(http.ErrAbortHandler)
	}
	last := make([]byte, 1)
	if _, err := io.ReadFull(body, last); err != nil {
		panic(http.ErrAbortHandler)
	}
	if hex.EncodeToString(h.Sum(nil)) != string(sum) {
		if r.Log != nil {
			r.Log.Warn("a peer's copy does not match its sha256: the client's download is cut before its last byte", "peer", p.ID, "sha256", sum)
		}
		panic(http.ErrAbortHandler)
	}
	if _, err := dst.Write(last); err != nil {
		panic(http.ErrAbortHandler)
	}
}
