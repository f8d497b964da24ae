package pull

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Resuming across restarts. What a pull keeps is its network bytes: for a
// raw source they are the file itself; for a compressed one, the blob
// (kept beside the file). A gzip stream cannot be restarted in the middle
// without the decompressor's state, which no inflater here can save; the
// blob is small beside the image and is needed anyway (peers stream it), so
// the kept blob is decompressed again, from the local disk, and the network
// continues where it ends.
//
// A checkpoint records how many network bytes are durable and their
// sha256. When a pull continues one, the kept bytes are read again through
// the same pipeline: their sha256 is compared with the checkpoint's before
// anything is asked of the network (a mismatch discards them and starts
// again from byte 0), and the digests of the file are computed over them as
// over fresh bytes. Nothing is taken on trust from the disk.

// Resumable is a Destination that keeps what a pull wrote across a restart
// of the process: *imagestore.Writer from Store.Resume is one.
type Resumable interface {
	// Kept prepares the destination to continue the pull of source from
	// its last checkpoint, and returns the network bytes it keeps (their
	// count, their sha256 as checkpointed, and a reader of them). With no
	// checkpoint for source it discards what it holds and returns 0 and a
	// nil reader.
	Kept(source string) (offset int64, sha256 string, kept io.ReadCloser, err error)
	// Checkpoint makes the first offset network bytes durable, and records
	// them, with their sha256, as a point a later pull of source may
	// continue from. It is called from another goroutine than the writes.
	Checkpoint(source string, offset int64, sha256 string) error
}

// errKept says that the bytes kept by an earlier pull are not those its
// checkpoint recorded: changed or cut while the server was down.
var errKept = errors.New("the partial download kept from before the restart does not match its checkpoint")

// sourceID names what a pull's network bytes are, so that a checkpoint is
// only continued by a pull of the same bytes, from whichever server: the
// file for a raw source, else the blob by digest, else the download by URL
// (hashed: a URL may hold credentials) and length.
func sourceID(src Source, obj object) string {
	switch {
	case src.Compression == "":
		return "file sha256:" + string(src.SHA256)
	case obj.digest != "":
		return "blob " + obj.digest.String()
	}
	sum := sha256.Sum256([]byte(src.URI))
	return "download sha256:" + hex.EncodeToString(sum[:]) + " length " + strconv.FormatInt(obj.size, 10)
}

// resumePlan is what a pass continues: the network bytes kept, and where
// to checkpoint them.
type resumePlan struct {
	dst    Resumable
	source string
	// kept is a reader of the first offset network bytes, whose sha256
	// the checkpoint says is sum; nil when nothing is kept.
	kept   io.Reader
	offset int64
	sum    string

	// After the pass: the offset the last checkpoint records, and how far
	// the network bytes went (the kept ones included).
	checkpointed, reached int64
}

// network is the network side of a pass: the bytes kept by an earlier pull,
// checked against their checkpoint, then the remote object from where they
// end. It hashes every byte (sha256, plus the blob digest's algorithm when
// that is another) and copies the remote ones to keep (the blob kept, if
// any).
type network struct {
	kept     io.Reader
	keptLeft int64
	keptSum  string
	// alive is called every keptPing bytes of the kept ones read.
	alive     func()
	sincePing int64
	remote    io.Reader
	keep      io.Writer
	sha256    hash.Hash
	other     hash.Hash
	off       int64
	marks     *marks
}

func (n *network) Read(p []byte) (int, error) {
	if n.keptLeft > 0 {
		return n.readKept(p)
	}
	m, err := n.remote.Read(p)
	if m > 0 {
		n.take(p[:m])
		if n.keep != nil {
			if _, werr := n.keep.Write(p[:m]); werr != nil {
				return 0, &writeError{fmt.Errorf("keeping the blob: %w", werr)}
			}
		}
		n.marks.add(n.off, n.sha256)
	}
	return m, err
}

// take counts p as the next bytes of the stream, and hashes them.
func (n *network) take(p []byte) {
	n.sha256.Write(p)
	if n.other != nil {
		n.other.Write(p)
	}
	n.off += int64(len(p))
}

func (n *network) readKept(p []byte) (int, error) {
	if int64(len(p)) > n.keptLeft {
		p = p[:n.keptLeft]
	}
	m, err := n.kept.Read(p)
	n.take(p[:m])
	n.keptLeft -= int64(m)
	if n.sincePing += int64(m); n.sincePing >= keptPing && n.alive != nil {
		n.sincePing -= keptPing
		n.alive()
	}
	if n.keptLeft == 0 {
		if got := hex.EncodeToString(n.sha256.Sum(nil)); got != n.keptSum {
			return m, fmt.Errorf("%w: its %d bytes have sha256 %s, the checkpoint says %s", errKept, n.off, got, n.keptSum)
		}
		return m, nil
	}
	switch {
	case errors.Is(err, io.EOF) || err == nil && m == 0:
		return m, fmt.Errorf("%w: %d bytes are left of the %d checkpointed", errKept, n.off, n.off+n.keptLeft)
	case err != nil:
		return m, fmt.Errorf("%w: reading it: %v", errKept, err)
	}
	return m, nil
}

// keptPing is how many kept bytes are read between two signs of life: a
// check of 20 GiB read back from a slow volume takes minutes.
const keptPing = 4 << 20

// checkKept reads what is left of the kept bytes and says whether they
// match their checkpoint: when decompression fails on them, a damaged
// partial must be told from a bad archive.
func (n *network) checkKept() error {
	buf := make([]byte, 64<<10)
	for n.keptLeft > 0 {
		if _, err := n.readKept(buf); err != nil {
			return err
		}
	}
	return nil
}

// marks are points of the network stream a checkpoint may record: an
// offset and the sha256 of the bytes before it. The producer adds one every
// markEvery bytes; the checkpointer takes the last one the destination has
// written.
type marks struct {
	mu   sync.Mutex
	ring [64]mark
	n    int
	last int64 // offset of the last mark added; the producer's alone
	wake chan struct{}
}

type mark struct {
	off int64
	sum string
}

// markEvery is the distance between marks: what a checkpoint may lag.
const markEvery = 512 << 10

func newMarks(from int64) *marks { return &marks{last: from, wake: make(chan struct{}, 1)} }

// add marks off, the offset h has hashed to, if markEvery bytes passed
// since the last mark.
func (m *marks) add(off int64, h hash.Hash) {
	if m == nil || off-m.last < markEvery {
		return
	}
	m.addNow(off, h)
}

func (m *marks) addNow(off int64, h hash.Hash) {
	if m == nil || off <= m.last {
		return
	}
	sum := hex.EncodeToString(h.Sum(nil))
	m.mu.Lock()
	m.ring[m.n%len(m.ring)] = mark{off, sum}
	m.n++
	m.mu.Unlock()
	m.last = off
	m.poke()
}

// poke wakes the checkpointer: a mark was added, or the destination wrote
// more (a mark already added may be durable now).
func (m *marks) poke() {
	if m == nil {
		return
	}
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// at is the last mark at or before limit.
func (m *marks) at(limit int64) (mark, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for i := m.n - 1; i >= 0 && i >= m.n-len(m.ring); i-- {
		if mk := m.ring[i%len(m.ring)]; mk.off <= limit {
			return mk, true
		}
	}
	return mark{}, false
}

// checkpointer records checkpoints while a pass runs: every
// CheckpointBytes network bytes, and once a CheckpointInterval when fewer
// came, of the last mark the destination holds (durable() bytes).
type checkpointer struct {
	plan    *resumePlan
	marks   *marks
	durable func() int64
	every   int64
	period  time.Duration
	// ahead is how far the destination may write past the last
	// checkpoint: what a SIGKILL may lose of what was written.
	ahead int64

	last   int64
	lastAt time.Time
	quit   chan struct{}
	done   chan struct{}

	// recorded is last, for the writers that hold; advanced is closed,
	// and replaced, each time it moves.
	mu       sync.Mutex
	recorded int64
	advanced chan struct{}
}

// aheadCheckpoints is how many CheckpointBytes the destination may write
// past the last checkpoint before its writes wait for one. A checkpoint
// is a small file written and renamed, not synced: it takes microseconds,
// and the writes never wait; on a disk busy with the download's own
// writeback it took up to 180 ms here, while 18 MiB more were written.
const aheadCheckpoints = 4

func (p *Puller) startCheckpoints(ctx context.Context, cancel context.CancelCauseFunc, plan *resumePlan, mk *marks, durable func() int64) *checkpointer {
	c := &checkpointer{
		plan: plan, marks: mk, durable: durable,
		every: p.checkpointBytes(), period: p.checkpointInterval(),
		ahead: aheadCheckpoints * p.checkpointBytes(),
		last:  plan.offset, lastAt: time.Now(),
		quit: make(chan struct{}), done: make(chan struct{}),
		recorded: plan.offset, advanced: make(chan struct{}),
	}
	go func() {
		defer close(c.done)
		tick := time.NewTicker(max(c.period/4, time.Millisecond))
		defer tick.Stop()
		for {
			select {
			case <-c.quit:
				return
			case <-ctx.Done():
				return
			case <-mk.wake:
			case <-tick.C:
			}
			if err := c.record(false); err != nil {
				cancel(&writeError{err})
				return
			}
		}
	}()
	return c
}

// record checkpoints the last mark the destination holds, when it is far
// enough past the last checkpoint (or when final).
func (c *checkpointer) record(final bool) error {
	m, ok := c.marks.at(c.durable())
	if !ok || m.off <= c.last {
		return nil
	}
	if !final && m.off-c.last < c.every && time.Since(c.lastAt) < c.period {
		return nil
	}
	if err := c.plan.dst.Checkpoint(c.plan.source, m.off, m.sum); err != nil {
		return fmt.Errorf("checkpointing the download: %w", err)
	}
	c.last, c.lastAt = m.off, time.Now()
	c.mu.Lock()
	c.recorded = m.off
	close(c.advanced)
	c.advanced = make(chan struct{})
	c.mu.Unlock()
	return nil
}

// hold returns once a write that takes the destination to end leaves it
// at most ahead bytes past the last checkpoint, or when the checkpoints
// or ctx end: a SIGKILL never loses more than that of what was written,
// however slow checkpoints are.
func (c *checkpointer) hold(ctx context.Context, end int64) {
	for {
		c.mu.Lock()
		ok, advanced := end-c.recorded <= c.ahead, c.advanced
		c.mu.Unlock()
		if ok {
			return
		}
		c.marks.poke()
		select {
		case <-advanced:
		case <-c.done:
			return
		case <-ctx.Done():
			return
		}
	}
}

// stop ends the checkpoints. With final, the last mark the destination
// holds is recorded, so that a pass ended by a shutdown or a network
// failure loses nothing it wrote.
func (c *checkpointer) stop(final bool) {
	if c == nil {
		return
	}
	close(c.quit)
	<-c.done
	if final {
		_ = c.record(true)
	}
	c.plan.checkpointed = c.last
}

// fileSink writes the file to the destination, past the first skip bytes
// (which it holds already, kept by an earlier pull), and counts the offset
// the destination's file has reached.
type fileSink struct {
	dst     io.Writer
	skip    int64
	reached atomic.Int64
	// hold, when set, is called before a write that takes reached to
	// end; wrote after it.
	hold  func(end int64)
	wrote func()
}

func (s *fileSink) Write(p []byte) (int, error) {
	n := len(p)
	if s.skip > 0 {
		k := min(s.skip, int64(len(p)))
		s.skip -= k
		s.reached.Add(k)
		p = p[k:]
	}
	if len(p) > 0 {
		if s.hold != nil {
			s.hold(s.reached.Load() + int64(len(p)))
		}
		m, err := s.dst.Write(p)
		s.reached.Add(int64(m))
		if err != nil {
			return n - len(p) + m, err
		}
	}
	if s.wrote != nil {
		s.wrote()
	}
	return n, nil
}

// asyncWriter writes to w from its own goroutine, through a bounded queue
// of buffers, so that the disk never holds the network reader (the blob
// kept is written beside the image). reached counts what w took.
type asyncWriter struct {
	w       io.Writer
	queue   chan []byte
	free    chan []byte
	pending sync.WaitGroup
	done    chan struct{}
	once    sync.Once
	err     error // set by the writing goroutine before done closes
	failed  atomic.Bool
	closed  bool
	reached atomic.Int64
	// hold and wrote, when set before the first Write, are called before
	// and after each write to w, as fileSink's.
	hold  func(end int64)
	wrote func()
}

func newAsyncWriter(w io.Writer, from int64, buffers, size int) *asyncWriter {
	a := &asyncWriter{w: w, queue: make(chan []byte, buffers), free: make(chan []byte, buffers), done: make(chan struct{})}
	a.reached.Store(from)
	for range buffers {
		a.free <- make([]byte, 0, size)
	}
	go func() {
		defer close(a.done)
		for b := range a.queue {
			if !a.failed.Load() {
				if a.hold != nil {
					a.hold(a.reached.Load() + int64(len(b)))
				}
				n, err := a.w.Write(b)
				a.reached.Add(int64(n))
				if err != nil {
					a.err = err
					a.failed.Store(true)
				}
				if a.wrote != nil {
					a.wrote()
				}
			}
			a.free <- b[:0]
			a.pending.Done()
		}
	}()
	return a
}

// Write queues a copy of p. It is called from one goroutine only.
func (a *asyncWriter) Write(p []byte) (int, error) {
	if a.closed {
		return 0, errors.New("write after the end of the blob")
	}
	if a.failed.Load() {
		return 0, errors.New("an earlier write failed")
	}
	for n := 0; n < len(p); {
		b := <-a.free
		m := min(len(p)-n, cap(b))
		a.pending.Add(1)
		a.queue <- append(b, p[n:n+m]...)
		n += m
	}
	return len(p), nil
}

// drain waits until what is queued is written.
func (a *asyncWriter) drain() { a.pending.Wait() }

// close writes what is queued, ends the writer, and says how the writing
// went. It may be called more than once.
func (a *asyncWriter) close() error {
	a.once.Do(func() {
		a.closed = true
		close(a.queue)
		<-a.done
	})
	return a.err
}
