package replica

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/sylva-projects/osimages/internal/fill"
	"github.com/sylva-projects/osimages/internal/imagestore"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/pull"
	"github.com/sylva-projects/osimages/internal/servedset"
)

// NewPuller is the puller of peer fills: a peer that sends nothing for
// wait is asked again from where it stopped, twice at most, before the
// fill's rule judges it.
func NewPuller(wait time.Duration) *pull.Puller {
	return &pull.Puller{
		HTTP: &http.Client{Transport: Transport()}, IdleTimeout: wait,
		MaxRetries: 2, Backoff: 200 * time.Millisecond, MaxBackoff: time.Second,
	}
}

// Source fills an image from one peer's endpoints (a fill.Source),
// verified as a registry pull is (sha256, md5, size), resumed with ranges:
// the compressed layer of the peer's registry pull while it is in
// progress, else the peer's image.
type Source struct {
	Peer Peer
	// Instance is the peer's instance (State.Instance) as its state was
	// read when it was chosen: a failure is held against that instance
	// alone (Filler).
	Instance string
	Puller   *pull.Puller
	// Wait is the peer's --peer-timeout, for the messages.
	Wait time.Duration
	Log  *slog.Logger
}

// Name says the source is this peer.
func (s Source) Name() string { return fill.FromPeerPrefix + s.Peer.ID }

// Fill fills dst with w from the peer. A peer whose layer went with the
// commit of its image while it was streamed is asked for the image.
func (s Source) Fill(ctx context.Context, w servedset.Wanted, dst *imagestore.Writer, progress pull.Progress) (pull.Result, error) {
	res, err := s.fill(ctx, w, dst, progress)
	if errors.Is(err, errCommitted) {
		if s.Log != nil {
			s.Log.Info("peer committed the image while its compressed layer was streamed; copying the image from it", "peer", s.Peer.ID, "sha256", w.SHA256, "key", w.Key)
		}
		if err := dst.Reset(); err != nil {
			return pull.Result{}, err
		}
		progress(0, 0)
		res, err = s.fill(ctx, w, dst, progress)
	}
	return res, err
}

func (s Source) fill(ctx context.Context, w servedset.Wanted, dst *imagestore.Writer, progress pull.Progress) (pull.Result, error) {
	src := pull.Source{
		URI:    s.Peer.URL + osimage.ImagePath(w.SHA256, w.Desc.Filename),
		SHA256: w.SHA256, MD5: w.Desc.MD5, Size: w.Desc.Size,
	}
	if w.Desc.Compression != "" {
		// A peer pulling the image from the registry keeps its compressed
		// layer: stream that, verified as a registry blob is. Without one
		// (the peer holds the image verified already), copy the image.
		blob, kept, err := s.blobDescriptor(ctx, w.SHA256)
		if err != nil {
			return pull.Result{}, err
		}
		if kept {
			src.URI = s.Peer.URL + BlobPath(w.SHA256)
			src.Compression = w.Desc.Compression
			src.BlobDigest, src.ArchiveSize = blob.Digest, blob.Size
		}
	}
	res, err := s.Puller.Pull(ctx, src, dst, progress)
	// Bytes that did not verify are the peer's fault, whatever it holds
	// now: only a stream cut short is taken up again from its image.
	if err != nil && ctx.Err() == nil && !errors.As(err, new(*pull.VerifyError)) && src.BlobDigest != "" && s.committed(ctx, w.SHA256) {
		return res, fmt.Errorf("%w: %w", errCommitted, err)
	}
	return res, err
}

// errCommitted says that a peer whose compressed layer was streamed
// committed the image meanwhile: the layer is gone (a resume of it fails),
// the image is there to copy.
var errCommitted = errors.New("the peer committed the image and removed its compressed layer")

// committed says whether the peer keeps no compressed layer of sum any
// more and holds the image verified.
func (s Source) committed(ctx context.Context, sum osimage.SHA256) bool {
	if _, kept, err := s.blobDescriptor(ctx, sum); err != nil || kept {
		return false
	}
	st, err := FetchState(ctx, s.Puller.HTTP, s.Peer)
	return err == nil && st.Images[sum].Verified()
}

// blobDescriptor asks the peer for the compressed layer of sum it keeps
// while it pulls it: kept is false when it keeps none (copy the image).
func (s Source) blobDescriptor(ctx context.Context, sum osimage.SHA256) (blobDescriptor, bool, error) {
	p := s.Peer
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.URL+BlobPath(sum)+"/descriptor", nil)
	if err != nil {
		return blobDescriptor{}, false, err
	}
	resp, err := s.Puller.HTTP.Do(req)
	if err != nil {
		return blobDescriptor{}, false, fmt.Errorf("asking peer %s for the compressed layer: %w", p.ID, err)
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusNotFound:
		return blobDescriptor{}, false, nil
	case http.StatusServiceUnavailable:
		return blobDescriptor{}, false, fmt.Errorf("asking peer %s for the compressed layer: it has not started keeping it within --peer-timeout (%s)", p.ID, s.Wait)
	default:
		return blobDescriptor{}, false, fmt.Errorf("asking peer %s for the compressed layer: %s", p.ID, resp.Status)
	}
	var d blobDescriptor
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&d); err != nil {
		return blobDescriptor{}, false, fmt.Errorf("peer %s's compressed layer descriptor: %w", p.ID, err)
	}
	if d.Size <= 0 {
		return blobDescriptor{}, false, fmt.Errorf("peer %s's compressed layer descriptor: size %d", p.ID, d.Size)
	}
	return d, true, nil
}
