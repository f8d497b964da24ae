package replica

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sylva-projects/osimages/internal/fill"
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
	ids := slices.Sorted(maps.Keys(byID))
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
// A peer is never trusted, whatever its state says:
//
//   - only a whole GET or HEAD is relayed (Relayable): a range of a
//     peer's copy cannot be checked, for the sha256 is of the whole
//     image, nor can a peer's 304 or 412; those wait for the copy
//     verified here;
//   - a peer's answer is refused before any byte reaches the client
//     unless it is a 200 of its stored file (not a download in progress,
//     InProgressHeader) of the declared size (Size);
//   - a whole image is hashed on the way, and its last byte held back
//     until its sha256 matches: a client never gets a complete image
//     that is not the one it asked for;
//   - a peer's answer must begin within Hold (the client's hold, shared
//     by the peers tried in turn); a peer is cut by Rule, the rule of a
//     fill from a peer (no byte for --peer-timeout, or slower than
//     --min-rate): a relay of a many-GiB image lasts as long as its bytes
//     flow, and no longer;
//   - as soon as this replica holds the image verified (Local), the
//     relay goes on from that copy, at the offset reached, still hashed;
//   - a peer that failed the image, a fill from it or a relay of it, is
//     not asked again for it (Failures).
type Relay struct {
	View *View
	// Client reaches the peers (Transport); it needs no overall timeout:
	// Hold and Rule bound a relay, SendTimeout each write to the client.
	Client *http.Client
	// SendTimeout bounds one write of the answer to the client.
	SendTimeout time.Duration
	// Hold bounds the wait for a peer's answer to begin, from the
	// client's request (--client-hold); 0 leaves only the request's
	// deadline and Rule.
	Hold time.Duration
	// Rule cuts a peer that stalls or trickles, counted from the request,
	// as a fill from a peer is cut (Contended nil: always). Its Stall is
	// also how long a relay whose peer broke off waits for the copy here.
	Rule fill.Rule
	// Failures are the peers that failed each image (Filler.Failures):
	// they are not relayed from, and a peer that fails a relay is added.
	// Nil remembers nothing.
	Failures *Failures
	// Size is the declared size of an image, 0 when none is declared: a
	// peer that announces another length is refused. Nil declares none.
	Size func(osimage.SHA256) int64
	// Local opens the copy of an image this replica holds verified; nil
	// (and no error) while it holds none. Nil: never.
	Local func(osimage.SHA256) (*os.File, error)
	Log   *slog.Logger
}

// relayPoll is how often a relay looks for a copy verified here, and
// whether its peer stalled.
const relayPoll = 100 * time.Millisecond

// Relayable says whether a client's request may be answered from a peer's
// copy: a GET or HEAD of the whole image, without conditions. A range is
// answered only from bytes verified here, and so is a conditional request
// (a peer's 304, 412 or 206 to If-Range cannot be checked).
func Relayable(r *http.Request) bool {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		return false
	}
	for _, h := range []string{"Range", "If-Range", "If-Match", "If-None-Match", "If-Modified-Since", "If-Unmodified-Since"} {
		if len(r.Header.Values(h)) > 0 {
			return false
		}
	}
	return true
}

// Holds says whether a peer that did not fail it holds sum verified.
func (r Relay) Holds(sum osimage.SHA256) bool { return len(r.holders(sum)) > 0 }

// holders are View.Holders but those that failed sum.
func (r Relay) holders(sum osimage.SHA256) []Peer {
	return slices.DeleteFunc(r.View.Holders(sum), func(p Peer) bool {
		return r.Failures != nil && r.Failures.Failed(r.View, sum, p.ID)
	})
}

func (r Relay) log() *slog.Logger {
	if r.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return r.Log
}

// errVerifiedHere ends a peer's part of a relay: the copy verified here
// goes on.
var errVerifiedHere = errors.New("the image is verified here")

// Serve answers the client's GET or HEAD of image sum under name from the
// first holder that answers with its verified file. It returns false,
// having written nothing, when none does, when the request is not
// Relayable, or when the image got verified here first (the caller then
// serves it).
func (r Relay) Serve(w http.ResponseWriter, req *http.Request, sum osimage.SHA256, name string) bool {
	if !Relayable(req) {
		return false
	}
	ctx := req.Context()
	var holdEnd time.Time
	if r.Hold > 0 {
		holdEnd = time.Now().Add(r.Hold)
	}
	for _, p := range r.holders(sum) {
		if ctx.Err() != nil || !holdEnd.IsZero() && time.Now().After(holdEnd) {
			return false
		}
		started, ended := r.try(ctx, w, req, p, sum, name, holdEnd)
		if started {
			return true
		}
		if ended {
			return false
		}
	}
	return false
}

// try relays p's copy. started says the client's answer began (whatever
// its end); ended, that trying the next peer makes no sense: the client's
// hold is over, its client left, or the copy here is verified.
func (r Relay) try(ctx context.Context, w http.ResponseWriter, req *http.Request, p Peer, sum osimage.SHA256, name string, holdEnd time.Time) (started, ended bool) {
	log := r.log().With("peer", p.ID, "sha256", sum)
	instance, _ := r.View.instanceOf(p.ID)
	fail := func(why string, args ...any) {
		if r.Failures != nil {
			r.Failures.Add(sum, p.ID, instance)
		}
		log.Warn("a peer failed to relay an image to a client: it is not asked for it again", append([]any{"why", why}, args...)...)
	}
	peerCtx, cut := context.WithCancelCause(ctx)
	defer cut(nil)
	wt := r.watch(peerCtx, cut, sum, holdEnd)
	report, stopRule := r.Rule.Watch(peerCtx, cut)
	defer stopRule()
	defer func() {
		if f := wt.stop(); f != nil {
			f.Close() // found while the peer's answer was awaited: the caller serves it
		}
	}()
	out, err := http.NewRequestWithContext(peerCtx, req.Method, p.URL+osimage.ImagePath(sum, name), nil)
	if err != nil {
		return false, true
	}
	out.Header.Set(RelayHeader, "client")
	resp, err := r.Client.Do(out)
	if err != nil {
		if r.theirs(ctx, peerCtx) {
			fail("no answer", "error", relayError(peerCtx, err))
			return false, false
		}
		return false, true
	}
	length, why := r.check(resp, sum)
	if why != "" {
		resp.Body.Close()
		fail(why)
		return false, false
	}
	wt.answered.Store(true)
	defer resp.Body.Close()
	// Only what is known of the image, not what the peer says of it.
	h := w.Header()
	h.Set("Content-Length", strconv.FormatInt(length, 10))
	h.Set("Content-Type", "application/octet-stream")
	h.Set("ETag", `"`+string(sum)+`"`)
	h.Set("Accept-Ranges", "bytes")
	w.WriteHeader(http.StatusOK)
	if req.Method == http.MethodHead {
		return true, true
	}
	r.stream(ctx, peerCtx, &httpsend.Writer{ResponseWriter: w, Timeout: r.SendTimeout}, resp.Body, length, wt, report, sum, fail)
	return true, true
}

// check says why a peer's answer is refused before any byte of it goes
// on, and the length of the image when it is not.
func (r Relay) check(resp *http.Response, sum osimage.SHA256) (int64, string) {
	declared := int64(0)
	if r.Size != nil {
		declared = r.Size(sum)
	}
	switch {
	case resp.Header.Get(InProgressHeader) != "":
		return 0, "it answered with a download in progress, not its verified copy"
	case resp.StatusCode != http.StatusOK:
		return 0, fmt.Sprintf("it answered %s to a GET of the whole image", resp.Status)
	case resp.ContentLength < 1:
		return 0, fmt.Sprintf("it announced no length (Content-Length %q)", resp.Header.Get("Content-Length"))
	case declared > 0 && resp.ContentLength != declared:
		return 0, fmt.Sprintf("it announced %d bytes, the image is declared %d", resp.ContentLength, declared)
	}
	return resp.ContentLength, ""
}

// theirs says whether the peer's part ended by the peer's fault: not the
// end of the client's hold, nor its client leaving, nor the copy here.
func (r Relay) theirs(ctx, peerCtx context.Context) bool {
	cause := context.Cause(peerCtx)
	return ctx.Err() == nil && !errors.Is(cause, errVerifiedHere) && !errors.Is(cause, errHoldOver)
}

// errHoldOver ends a relay whose peer did not begin its answer within the
// client's hold: the client gets the caller's 503, and the peer is not
// blamed (its answer may have been on its way).
var errHoldOver = errors.New("the client's hold is over before the peer answered")

func relayError(peerCtx context.Context, err error) error {
	if cause := context.Cause(peerCtx); cause != nil {
		return cause
	}
	return err
}

// stream sends the length bytes of the image to dst, from body then, as
// soon as there is one, from the copy verified here at the offset
// reached; all but the last byte as they come, the last once the sha256
// of all matches sum. A stream that cannot be completed, or does not
// match, cuts the client's connection, which the client sees as a failed
// download.
func (r Relay) stream(ctx, peerCtx context.Context, dst io.Writer, body io.Reader, length int64, wt *watcher, report func(int64), sum osimage.SHA256, fail func(string, ...any)) {
	log := r.log().With("sha256", sum)
	h := sha256.New()
	var read int64
	var last byte
	src, fromPeer := body, true
	buf := make([]byte, 64<<10)
	for read < length {
		n, err := src.Read(buf[:min(int64(len(buf)), length-read)])
		if n > 0 {
			h.Write(buf[:n])
			out := buf[:n]
			if read+int64(n) == length {
				last, out = out[n-1], out[:n-1]
			}
			if _, err := dst.Write(out); err != nil {
				panic(http.ErrAbortHandler) // the client left or stopped reading
			}
			read += int64(n)
			if fromPeer {
				report(read)
			}
		}
		switch {
		case read == length:
		case err == nil:
			continue
		case !fromPeer:
			log.Error("reading the copy verified here failed: the client's download is cut", "error", err)
			panic(http.ErrAbortHandler)
		default:
			local := wt.stop()
			if local == nil && r.theirs(ctx, peerCtx) {
				fail("its copy broke off", "at", read, "of", length, "error", relayError(peerCtx, err))
				local = r.await(ctx, sum)
			}
			if local == nil {
				panic(http.ErrAbortHandler) // the relay's time is over, or its client left
			}
			defer local.Close()
			if fi, err := local.Stat(); err != nil || fi.Size() != length {
				fail("its length is not the image's", "announced", length)
				panic(http.ErrAbortHandler)
			}
			log.Info("the image is verified here: a relayed download goes on from this copy", "at", read, "of", length)
			src, fromPeer = io.NewSectionReader(local, read, length-read), false
		}
	}
	if hex.EncodeToString(h.Sum(nil)) != string(sum) {
		fail("its copy does not match its sha256: the client's download is cut before its last byte")
		panic(http.ErrAbortHandler)
	}
	if _, err := dst.Write([]byte{last}); err != nil {
		panic(http.ErrAbortHandler)
	}
}

// await waits for the copy verified here, while the client would wait
// for a peer that sends nothing (Rule.Stall, or Hold when there is none),
// and no longer than ctx.
func (r Relay) await(ctx context.Context, sum osimage.SHA256) *os.File {
	if r.Local == nil {
		return nil
	}
	if wait := cmp.Or(r.Rule.Stall, r.Hold); wait > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, wait)
		defer cancel()
	}
	tick := time.NewTicker(relayPoll)
	defer tick.Stop()
	for {
		if f, _ := r.Local(sum); f != nil {
			return f
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// watcher cuts a peer's part of a relay (its context) when the copy
// here is verified (errVerifiedHere), or the client's hold ends before the
// peer answered (errHoldOver); Relay.Rule cuts a peer that stalls or
// trickles.
type watcher struct {
	// answered says the peer's answer began: the hold no longer applies.
	answered atomic.Bool
	done     chan struct{}
	stopOnce sync.Once
	exited   chan struct{}
	// local is the copy verified here the watcher found.
	local *os.File
}

func (r Relay) watch(ctx context.Context, cut context.CancelCauseFunc, sum osimage.SHA256, holdEnd time.Time) *watcher {
	wt := &watcher{done: make(chan struct{}), exited: make(chan struct{})}
	go func() {
		defer close(wt.exited)
		tick := time.NewTicker(relayPoll)
		defer tick.Stop()
		for {
			select {
			case <-wt.done:
				return
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			if r.Local != nil {
				if f, _ := r.Local(sum); f != nil {
					wt.local = f
					cut(errVerifiedHere)
					return
				}
			}
			if !wt.answered.Load() && !holdEnd.IsZero() && time.Now().After(holdEnd) {
				cut(errHoldOver)
				return
			}
		}
	}()
	return wt
}

// stop ends the watch, and hands over the copy verified here it found,
// if any; the caller closes it.
func (wt *watcher) stop() *os.File {
	wt.stopOnce.Do(func() { close(wt.done) })
	<-wt.exited
	f := wt.local
	wt.local = nil
	return f
}
