// Package fill is where an image's bytes come from. A Source fills a
// store writer with one wanted image, verified as a registry pull is, and
// reports its progress: the registry (Registries), a peer replica (package
// replica) and an ordered Chain of them. Every fill runs under one Rule
// that cuts it when it stalls, or when it is slower than a minimum rate,
// whatever the source: the server, the peer fill and the registry's
// connection resume all take their timing from it.
package fill

import (
	"context"
	"errors"
	"fmt"

	"github.com/sylva-projects/osimages/internal/imagestore"
	"github.com/sylva-projects/osimages/internal/pull"
	"github.com/sylva-projects/osimages/internal/servedset"
)

// Source fills dst with w, verified: the layer's digest, the sha256, md5
// and size of the file. progress gets the network bytes received and the
// total expected (0 when unknown); a call without new bytes is a sign of
// life (the bytes kept by an earlier attempt being read back and checked).
// On error dst holds garbage, up to a checkpoint maybe (Chain keeps it):
// a source continues from it as pull.Puller does (imagestore.Writer.Kept
// first, which resets dst when the checkpoint is of other bytes), or
// resets dst before its first byte.
type Source interface {
	Fill(ctx context.Context, w servedset.Wanted, dst *imagestore.Writer, progress pull.Progress) (pull.Result, error)
	// Name says where the bytes come from, for the image's state:
	// "registry", "peer <id>".
	Name() string
}

// The names of sources the server's state shows.
const (
	// FromRegistry: pulled from the image's registry (or HTTP server).
	FromRegistry = "registry"
	// FromStore: found verified on disk at start.
	FromStore = "store"
	// FromPeerPrefix starts the name of a peer replica's source.
	FromPeerPrefix = "peer "
)

// Func is a Source of a function.
type Func struct {
	Label string
	F     func(ctx context.Context, w servedset.Wanted, dst *imagestore.Writer, progress pull.Progress) (pull.Result, error)
}

// Fill calls F.
func (f Func) Fill(ctx context.Context, w servedset.Wanted, dst *imagestore.Writer, progress pull.Progress) (pull.Result, error) {
	return f.F(ctx, w, dst, progress)
}

// Name is Label.
func (f Func) Name() string { return f.Label }

// Chooser picks the next source of an image: a peer, or nil for the last
// resort. It is told of the sources that fail (Chain.Failed) and decides
// when to give one again: a peer that failed may run again, as another
// process under the same name (replica.Filler).
type Chooser func(w servedset.Wanted) Source

// Chain fills from the sources Choose gives, in turn, and from Last when it
// gives none: a source that fails (not ctx) is reported, skipped, and the
// next is tried. What a source wrote before it failed is kept, for the
// next to continue from its checkpoint when it sends the same bytes (a
// peer that died streaming the registry's layer, then the registry: see
// pull.Resumable), unless the source was refused for its content (a
// *pull.VerifyError) or nothing was checkpointed: then dst is reset and
// the next starts from byte 0. Each source runs
// under Rule(source).
type Chain struct {
	Choose Chooser
	Last   Source
	// Rule is the rule a source's fill runs under.
	Rule func(Source) Rule
	// Started, when set, is told which source a fill starts from, before
	// its first byte (peers read it: they follow a registry pull).
	Started func(w servedset.Wanted, src Source)
	// Failed, when set, is told of a source that failed, for Choose to
	// skip it.
	Failed func(w servedset.Wanted, src Source, err error)
}

// Fill fills dst from the chain's sources, and returns the name of the one
// that filled it.
func (c Chain) Fill(ctx context.Context, w servedset.Wanted, dst *imagestore.Writer, progress pull.Progress) (pull.Result, string, error) {
	for {
		// Whether src is the last resort is known from where it came, not
		// by comparing it with Last: two Sources of a type that cannot be
		// compared (a Func, a struct holding a func) would panic.
		src, last := c.Last, true
		if c.Choose != nil {
			if s := c.Choose(w); s != nil {
				src, last = s, false
			}
		}
		if c.Started != nil {
			c.Started(w, src)
		}
		res, err := c.Rule(src).Run(ctx, func(ctx context.Context, progress pull.Progress) (pull.Result, error) {
			return src.Fill(ctx, w, dst, progress)
		}, progress)
		if err == nil || last || ctx.Err() != nil {
			return res, src.Name(), err
		}
		if c.Failed != nil {
			c.Failed(w, src, err)
		}
		if dst.Checkpointed() && !errors.As(err, new(*pull.VerifyError)) {
			// Cut short, not lying: the next source's pull checks the
			// bytes kept against their checkpoint before it continues.
			continue
		}
		if rerr := dst.Reset(); rerr != nil {
			return pull.Result{}, "", errors.Join(err, fmt.Errorf("discarding what %s wrote: %w", src.Name(), rerr))
		}
		progress(0, 0)
	}
}
