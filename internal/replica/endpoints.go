package replica

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/sylva-projects/osimages/internal/httpsend"
	"github.com/sylva-projects/osimages/internal/imagestore"
	"github.com/sylva-projects/osimages/internal/osimage"
)

// Holder is what the peer endpoints need of the replica's server.
type Holder interface {
	// State is this replica's images.
	State() State
	// Offer says what this replica can send of sum now; name is the file
	// name asked for ("" for the compressed layer).
	Offer(sum osimage.SHA256, name string) Offer
	// Changed is closed at the next change of what State and Offer say:
	// an image selected, claimed, started, committed or dropped.
	Changed() <-chan struct{}
	// ServeStored serves the verified file of sum.
	ServeStored(w http.ResponseWriter, r *http.Request, sum osimage.SHA256)
}

// Offer is what a replica can send of one image.
type Offer struct {
	// Known: the image is served here under the name asked (selected, or
	// stored under it).
	Known bool
	// Stored: it is held verified.
	Stored bool
	// Download is its fill in progress, from the registry or from a peer,
	// which peers may stream (its image, and its compressed layer when it
	// keeps one); Started says that network bytes came, Committing that
	// the fill ended and is being committed.
	Download            *imagestore.Writer
	Started, Committing bool
	// Size is its declared size, 0 when unknown.
	Size int64
}

// Endpoints serve the peer-only listener (--peer-listen): the images,
// verified or, while they are filled, in progress; their compressed layers
// in progress; and the replica's state. Clients never
// reach it: only the headless Service names its port, and bytes in
// progress are unverified.
type Endpoints struct {
	Holder Holder
	// Wait is how long a request for an image the replica has not started
	// pulling waits for it (--peer-timeout).
	Wait time.Duration
	// SendTimeout bounds the time without progress of a response.
	SendTimeout time.Duration
}

// BlobPath is where the peer listener serves the compressed layer of the
// image sum while it fills it.
func BlobPath(sum osimage.SHA256) string { return "/peer/blobs/" + string(sum) }

// Handler serves the endpoints.
func (e Endpoints) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /images/{sha256}/{file}", e.serveImage)
	mux.HandleFunc("GET /peer/blobs/{sha256}", e.serveBlob)
	mux.HandleFunc("GET /peer/blobs/{sha256}/descriptor", e.serveBlobDescriptor)
	mux.HandleFunc("GET "+StatePath, func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(e.Holder.State())
	})
	return httpsend.Deadline(e.SendTimeout, mux)
}

// Server is an http.Server for Handler.
func (e Endpoints) Server() *http.Server {
	return &http.Server{Handler: e.Handler(), ReadHeaderTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute, ConnContext: httpsend.ConnContext}
}

// await asks decide, again at each change of the holder, until it says
// done, the request ends or Wait has passed (timedOut).
func (e Endpoints) await(r *http.Request, decide func(Offer) bool, sum osimage.SHA256, name string) (o Offer, timedOut bool) {
	deadline := time.NewTimer(e.Wait)
	defer deadline.Stop()
	for {
		// The signal first: a change between the offer and the wait is
		// not missed.
		changed := e.Holder.Changed()
		o = e.Holder.Offer(sum, name)
		if decide(o) {
			return o, false
		}
		// A layer is created by the pull without a change of the image's
		// state, just before its first byte: look again soon while a pull
		// has not started.
		soon := time.NewTimer(time.Hour)
		if o.Download != nil && !o.Started {
			soon.Reset(20 * time.Millisecond)
		}
		select {
		case <-r.Context().Done():
			soon.Stop()
			return o, true
		case <-deadline.C:
			soon.Stop()
			return e.Holder.Offer(sum, name), true
		case <-changed:
		case <-soon.C:
		}
		soon.Stop()
	}
}

// serveImage serves an image: verified, or its fill in progress.
// It waits for the pull to start, or to be verified: a follower asks as
// soon as it knows this replica pulls the image, which may be before this
// replica has read the selection that names it (replicas read it each at
// their own pace).
func (e Endpoints) serveImage(w http.ResponseWriter, r *http.Request) {
	req, ok := osimage.ParseImagePath(r.URL.EscapedPath())
	if !ok || req.Checksum != "" {
		http.NotFound(w, r)
		return
	}
	streamable := func(o Offer) bool { return o.Known && o.Download != nil && !o.Committing && o.Size > 0 }
	o, _ := e.await(r, func(o Offer) bool { return o.Known && o.Stored || streamable(o) }, req.SHA256, req.Name())
	switch {
	case r.Context().Err() != nil:
	case o.Known && o.Stored:
		e.Holder.ServeStored(w, r, req.SHA256)
	case streamable(o):
		e.serveInProgress(w, r, o.Download.Tail, o.Size)
	case !o.Known:
		http.Error(w, "this replica does not serve that image", http.StatusNotFound)
	default:
		w.Header().Set("Retry-After", "1")
		http.Error(w, "this replica is not filling the image", http.StatusServiceUnavailable)
	}
}

// blobAnswer is what the peer listener says of the compressed layer of an
// image.
type blobAnswer int

const (
	// blobKept: the layer is kept, to stream.
	blobKept blobAnswer = iota
	// blobNone: there is none and will be none (the image is verified,
	// its fill keeps none, or its layer is not offered): copy the image.
	blobNone
	// blobNotYet: this replica has not started keeping it (it has not
	// read the selection yet, or not claimed the image, or is committing
	// it) within Wait.
	blobNotYet
)

// blob waits (up to Wait) for the fill of sum to say whether it
// keeps its layer: the writer that keeps it, or why there is none to
// stream. A replica that claimed the image but has not started keeping its
// layer is waited for, never taken for one that has none.
func (e Endpoints) blob(r *http.Request, sum osimage.SHA256) (*imagestore.Writer, imagestore.Blob, blobAnswer) {
	var b imagestore.Blob
	answer := blobNotYet
	decide := func(o Offer) bool {
		switch {
		case o.Download != nil:
			// The layer is kept before the first network byte: once bytes
			// came without one, there will be none; but a commit ends it
			// before the image is stored, and is waited for.
			if kept, ok := o.Download.Blob(); ok {
				// Of unknown length (an HTTP source without
				// archive-size), it is not offered: copy the image.
				b, answer = kept, blobNone
				if kept.Size > 0 {
					answer = blobKept
				}
				return true
			}
			if o.Started && !o.Committing {
				answer = blobNone
				return true
			}
		case o.Stored:
			answer = blobNone
			return true
		}
		return false
	}
	o, timedOut := e.await(r, decide, sum, "")
	if timedOut {
		// An image not known yet may be selected here in a moment, a
		// queued one claimed: neither is a peer without the image.
		return nil, imagestore.Blob{}, blobNotYet
	}
	return o.Download, b, answer
}

// answerNoBlob answers a request for a layer that is not streamed: 404
// when there is none to wait for, 503 with Retry-After when there is none
// yet.
func answerNoBlob(w http.ResponseWriter, answer blobAnswer) {
	if answer == blobNotYet {
		w.Header().Set("Retry-After", "1")
		http.Error(w, "this replica has not started keeping the compressed layer of this image yet", http.StatusServiceUnavailable)
		return
	}
	http.Error(w, "no compressed layer of this image is kept here: copy the image", http.StatusNotFound)
}

// blobDescriptor is the layer kept by a peer, as JSON.
type blobDescriptor struct {
	Digest string `json:"digest"`
	Size   int64  `json:"size"`
}

func (e Endpoints) serveBlobDescriptor(w http.ResponseWriter, r *http.Request) {
	sum, err := osimage.ParseSHA256(r.PathValue("sha256"))
	if err != nil {
		http.NotFound(w, r)
		return
	}
	_, b, answer := e.blob(r, sum)
	if answer != blobKept {
		answerNoBlob(w, answer)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(blobDescriptor{Digest: b.Digest, Size: b.Size})
}

func (e Endpoints) serveBlob(w http.ResponseWriter, r *http.Request) {
	sum, err := osimage.ParseSHA256(r.PathValue("sha256"))
	if err != nil {
		http.NotFound(w, r)
		return
	}
	writer, b, answer := e.blob(r, sum)
	if answer != blobKept {
		answerNoBlob(w, answer)
		return
	}
	if b.Digest != "" {
		w.Header().Set("Docker-Content-Digest", b.Digest)
	}
	e.serveInProgress(w, r, writer.TailBlob, b.Size)
}

// serveInProgress streams a download in progress: one range (bytes=N- or
// bytes=N-M) or the whole, with the declared size as length. A download
// abandoned or started again cuts the connection: the follower's
// verification would refuse the bytes anyway.
func (e Endpoints) serveInProgress(w http.ResponseWriter, r *http.Request, open func(context.Context, int64) (io.ReadCloser, error), size int64) {
	from, to := int64(0), size-1
	status := http.StatusOK
	if h := r.Header.Get("Range"); h != "" {
		spec, ok := strings.CutPrefix(h, "bytes=")
		a, b, ok2 := strings.Cut(spec, "-")
		n, err := strconv.ParseInt(a, 10, 64)
		if !ok || !ok2 || err != nil || n < 0 || n >= size {
			w.Header().Set("Content-Range", "bytes */"+strconv.FormatInt(size, 10))
			http.Error(w, "requested range not satisfiable", http.StatusRequestedRangeNotSatisfiable)
			return
		}
		from = n
		if b != "" {
			m, err := strconv.ParseInt(b, 10, 64)
			if err != nil || m < from {
				http.Error(w, "requested range not satisfiable", http.StatusRequestedRangeNotSatisfiable)
				return
			}
			to = min(m, size-1)
		}
		status = http.StatusPartialContent
		w.Header().Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", from, to, size))
	}
	tail, err := open(r.Context(), from)
	if err != nil {
		w.Header().Set("Retry-After", "1")
		http.Error(w, err.Error(), http.StatusServiceUnavailable)
		return
	}
	defer tail.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(to-from+1, 10))
	w.Header().Set("X-Osimages-In-Progress", "true")
	w.WriteHeader(status)
	if _, err := io.CopyN(&httpsend.Writer{ResponseWriter: w, Timeout: e.SendTimeout}, tail, to-from+1); err != nil {
		panic(http.ErrAbortHandler)
	}
}
