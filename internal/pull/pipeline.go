package pull

import (
	"bufio"
	"context"
	"crypto/md5"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/klauspost/compress/gzip"
	"github.com/opencontainers/go-digest"
)

// The pipeline of one pass, on as many cores as there are:
//
//	goroutine 1: network -> blob digest -> gunzip -> buffer   (the producer)
//	goroutine 2: buffer -> sha256
//	goroutine 3: buffer -> md5
//	goroutine 4: buffer -> destination
//
// The producer fills buffers from a fixed pool; each buffer goes to every
// consumer and returns to the pool when the last one is done with it. md5
// (about 550 MB/s here) is the slowest stage and runs alone; the rest share
// the other core. Memory is the pool, whatever the image size.

// passResult is what one pass computed.
type passResult struct {
	sha256, md5 string
	// blob is the hex digest of the network bytes, for OCI sources.
	blob string
	size int64
}

// compressedReadBuffer is what gunzip reads from the network at a time.
const compressedReadBuffer = 256 << 10

func (p *Puller) pass(ctx context.Context, rr *rangeReader, src Source, obj object, dst io.Writer, blob io.Writer, plan *resumePlan) (passResult, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	rr.ctx = ctx
	defer rr.closeBody()

	// Every network byte is hashed with sha256 as it arrives: that is the
	// blob digest (for the usual sha256 one), the file's sha256 for a raw
	// source, and what checkpoints record.
	net := &network{remote: rr, sha256: sha256.New()}
	var keep *asyncWriter
	if blob != nil {
		from := int64(0)
		if plan != nil && plan.kept != nil {
			from = plan.offset
		}
		keep = newAsyncWriter(blob, from, 8, compressedReadBuffer)
		net.keep = keep
		defer keep.close()
	}
	if obj.digest != "" && obj.digest.Algorithm() != digest.SHA256 {
		if !obj.digest.Algorithm().Available() {
			return passResult{}, fmt.Errorf("layer digest %s: algorithm %s is not supported", obj.digest, obj.digest.Algorithm())
		}
		net.other = obj.digest.Algorithm().Hash()
	}
	if plan != nil && plan.kept != nil {
		net.kept, net.keptLeft, net.keptSum = plan.kept, plan.offset, plan.sum
		if progress := rr.progress; progress != nil {
			net.alive = func() { progress(plan.offset, max(rr.size, 0)) }
		}
	}

	md := md5.New()
	out := &fileSink{dst: dst}
	sinks := []io.Writer{md, out}
	var sha hash.Hash
	if src.Compression != "" {
		sha = sha256.New()
		sinks = append(sinks, sha)
	} else if plan != nil {
		// The file holds the kept bytes already.
		out.skip = plan.offset
	}
	// The checkpoints are set up before the first network byte is read
	// (gunzip reads the header at once): each write of the durable
	// destination (the blob kept, else the file) wakes the checkpointer,
	// so that a mark is recorded as soon as it is durable, and waits when
	// it is too far ahead of the last checkpoint.
	var ckpt *checkpointer
	if plan != nil {
		net.marks = newMarks(plan.offset)
		var durable *atomic.Int64
		if keep != nil {
			durable = &keep.reached
			keep.hold, keep.wrote = func(end int64) { ckpt.hold(ctx, end) }, net.marks.poke
		} else {
			durable = &out.reached
			out.hold, out.wrote = func(end int64) { ckpt.hold(ctx, end) }, net.marks.poke
		}
		ckpt = p.startCheckpoints(ctx, cancel, plan, net.marks, durable.Load)
	}

	var size int64
	var err error
	var compressed *bufio.Reader
	if src.Compression == "gz" {
		// klauspost's inflater has a fast path for a *bufio.Reader.
		compressed = bufio.NewReaderSize(net, compressedReadBuffer)
		var zr *gzip.Reader
		if zr, err = gzip.NewReader(compressed); err == nil {
			size, err = p.fanOut(ctx, cancel, zr, sinks, src.Size)
		}
	} else {
		size, err = p.fanOut(ctx, cancel, net, sinks, src.Size)
	}
	if err != nil {
		if keep != nil {
			// What reached the blob is what a checkpoint may record.
			keep.drain()
		}
		if plan != nil {
			// Keep what was written for the next pull: a shutdown, a
			// network that failed, a watchdog that cut the download.
			net.marks.addNow(net.off, net.sha256)
		}
		ckpt.stop(net.keptLeft == 0)
		if plan != nil {
			plan.reached = max(net.off, plan.offset)
		}
		var werr *writeError
		switch {
		case errors.As(err, &werr):
		case net.keptLeft > 0:
			// The kept bytes did not decompress: damaged, or a bad
			// archive; their sha256 tells.
			if kerr := net.checkKept(); kerr != nil {
				err = kerr
			} else if ctx.Err() == nil {
				err = &contentError{err}
			}
		case rr.err() != nil:
			// The network failed (or cannot resume): whatever gunzip made
			// of it, that is the cause.
			err = rr.err()
		case isVerifyError(err):
			err = &contentError{err}
		case compressed != nil && ctx.Err() == nil && !errors.Is(err, errKept):
			err = p.decompressError(rr, err, compressed, obj, net)
			if !errors.Is(err, errKept) {
				// Whatever stopped the read of the rest (a shutdown, a
				// stall), the bytes so far do not decompress.
				err = &contentError{err}
			}
		}
		return passResult{}, err
	}
	ckpt.stop(false)
	if plan != nil {
		plan.reached = net.off
	}
	if compressed != nil {
		// The gzip stream ended: the blob digest covers the whole blob, so
		// read what may follow (nothing, for a well-formed layer).
		if _, err := io.Copy(io.Discard, compressed); err != nil {
			return passResult{}, err
		}
	}
	if keep != nil {
		if err := keep.close(); err != nil {
			return passResult{}, &writeError{fmt.Errorf("keeping the blob: %w", err)}
		}
	}
	got := passResult{md5: hex.EncodeToString(md.Sum(nil)), size: size}
	netSum := hex.EncodeToString(net.sha256.Sum(nil))
	if sha != nil {
		got.sha256 = hex.EncodeToString(sha.Sum(nil))
	} else {
		got.sha256 = netSum
	}
	switch {
	case net.other != nil:
		got.blob = hex.EncodeToString(net.other.Sum(nil))
	case obj.digest != "":
		got.blob = netSum
	}
	return got, nil
}

// decompressError explains a gzip failure. Corrupted network bytes break
// the gzip stream long before the end, so the rest of the blob is read to
// tell a transfer that went wrong (blob digest mismatch) from an artifact
// that is not gzip.
func (p *Puller) decompressError(rr *rangeReader, gzErr error, compressed *bufio.Reader, obj object, net *network) error {
	if err := rr.err(); err != nil {
		return err
	}
	if net.keptLeft > 0 {
		if err := net.checkKept(); err != nil {
			return err
		}
	}
	if obj.digest != "" {
		if _, err := io.Copy(io.Discard, compressed); err != nil {
			return fmt.Errorf("decompressing: %v; then reading the rest of the blob: %w", gzErr, err)
		}
		h := net.sha256
		if net.other != nil {
			h = net.other
		}
		if got := hex.EncodeToString(h.Sum(nil)); got != obj.digest.Encoded() {
			return fmt.Errorf("%w (and the layer does not decompress: %v)", &VerifyError{What: WhatBlobDigest, Expected: obj.digest.String(), Actual: string(obj.digest.Algorithm()) + ":" + got}, gzErr)
		}
	}
	return fmt.Errorf("the download is not a valid gzip archive (compression: gz): %w", gzErr)
}

// contentError says that the bytes of a pass are wrong, not cut: they do
// not decompress, or do not verify. Nothing of such a pass may be continued
// from, and a pass that continued bytes kept by an earlier pull is started
// again from byte 0 (the network may have corrupted them before they were
// kept: their checkpoint vouches for what was received, not for what the
// registry holds).
type contentError struct{ err error }

func (e *contentError) Error() string { return e.err.Error() }
func (e *contentError) Unwrap() error { return e.err }

func isVerifyError(err error) bool {
	var v *VerifyError
	return errors.As(err, &v)
}

// writeError is a failure of a sink: the destination, in practice.
type writeError struct{ err error }

func (e *writeError) Error() string { return "writing the image: " + e.err.Error() }
func (e *writeError) Unwrap() error { return e.err }

type chunk struct {
	buf  []byte
	n    int
	refs atomic.Int32
}

// fanOut reads r to its end and writes everything to each sink, each sink
// in its own goroutine. It stops with a *VerifyError once more than limit
// bytes came (limit > 0), so that a wrong or hostile archive cannot fill
// the disk. A sink error cancels ctx, which stops the network.
func (p *Puller) fanOut(ctx context.Context, cancel context.CancelCauseFunc, r io.Reader, sinks []io.Writer, limit int64) (int64, error) {
	nbuf := p.buffers()
	free := make(chan *chunk, nbuf)
	for range nbuf {
		free <- &chunk{buf: make([]byte, p.bufferSize())}
	}
	queues := make([]chan *chunk, len(sinks))
	errs := make([]error, len(sinks))
	var wg sync.WaitGroup
	for i, w := range sinks {
		// As deep as the pool: a send never blocks.
		q := make(chan *chunk, nbuf)
		queues[i] = q
		wg.Go(func() {
			for c := range q {
				if errs[i] == nil {
					if _, err := w.Write(c.buf[:c.n]); err != nil {
						errs[i] = err
						cancel(err)
					}
				}
				if c.refs.Add(-1) == 0 {
					free <- c
				}
			}
		})
	}

	var total int64
	var readErr error
	for readErr == nil {
		var c *chunk
		select {
		case c = <-free:
		case <-ctx.Done():
			readErr = context.Cause(ctx)
			continue
		}
		c.n, readErr = fill(r, c.buf)
		if c.n == 0 {
			free <- c
			continue
		}
		total += int64(c.n)
		if limit > 0 && total > limit {
			free <- c
			readErr = &VerifyError{What: WhatSize, Expected: strconv.FormatInt(limit, 10), Actual: "more than that"}
			break
		}
		c.refs.Store(int32(len(sinks)))
		for _, q := range queues {
			q <- c
		}
	}
	for _, q := range queues {
		close(q)
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return total, &writeError{err}
		}
	}
	if errors.Is(readErr, io.EOF) {
		return total, nil
	}
	return total, readErr
}

// fill reads into buf until it is full or r fails; io.EOF marks the end.
func fill(r io.Reader, buf []byte) (int, error) {
	n := 0
	for n < len(buf) {
		m, err := r.Read(buf[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}
