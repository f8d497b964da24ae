package testenv

import (
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// CutProxy is a TCP proxy on 127.0.0.1 that forwards to a target and cuts
// each connection once the target has sent a given number of bytes on it,
// the way a flaky network or a proxy with a transfer limit does. It counts
// every byte the target sent through it, so that a test can tell how much a
// client downloaded in total.
type CutProxy struct {
	// Addr is host:port to connect to instead of the target.
	Addr string

	target   string
	ln       net.Listener
	cutAfter int64
	maxCuts  atomic.Int64

	forwarded atomic.Int64
	cuts      atomic.Int64

	mu     sync.Mutex
	open   map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// StartCutProxy starts a proxy to target (host:port) that cuts every
// connection after cutAfter bytes from the target (0: never), until Close or
// the end of the test.
func StartCutProxy(t testing.TB, target string, cutAfter int64) *CutProxy {
	t.Helper()
	p, err := NewCutProxy(target, cutAfter)
	if err != nil {
		t.Fatalf("starting the cut proxy: %v", err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// NewCutProxy is StartCutProxy for code without a testing.TB (benchmarks).
func NewCutProxy(target string, cutAfter int64) (*CutProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &CutProxy{Addr: ln.Addr().String(), target: target, cutAfter: cutAfter, ln: ln, open: map[net.Conn]struct{}{}}
	p.maxCuts.Store(-1)
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// SetMaxCuts stops cutting connections opened once n connections were cut
// (negative: no limit).
func (p *CutProxy) SetMaxCuts(n int64) { p.maxCuts.Store(n) }

// Forwarded is the number of bytes the target sent to clients, over all
// connections.
func (p *CutProxy) Forwarded() int64 { return p.forwarded.Load() }

// Cuts is the number of connections cut.
func (p *CutProxy) Cuts() int64 { return p.cuts.Load() }

// Close stops accepting, closes the open connections and waits for them.
func (p *CutProxy) Close() error {
	err := p.ln.Close()
	p.mu.Lock()
	p.closed = true
	for c := range p.open {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
	return err
}

func (p *CutProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		c.Close()
		return false
	}
	p.open[c] = struct{}{}
	return true
}

func (p *CutProxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.open, c)
	p.mu.Unlock()
	c.Close()
}

func (p *CutProxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go p.serve(client)
	}
}

func (p *CutProxy) serve(client net.Conn) {
	defer p.wg.Done()
	if !p.track(client) {
		return
	}
	defer p.untrack(client)
	upstream, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	if !p.track(upstream) {
		return
	}
	defer p.untrack(upstream)

	limit := p.cutAfter
	if most := p.maxCuts.Load(); most >= 0 && p.cuts.Load() >= most {
		limit = 0
	}
	go func() {
		// Requests flow freely; closing either side ends both copies.
		io.Copy(upstream, client)
		upstream.Close()
	}()

	buf := make([]byte, 32<<10)
	var sent int64
	for {
		want := buf
		if limit > 0 {
			// Read no more than the threshold, so that what is counted is
			// exactly what the client got.
			want = buf[:min(int64(len(buf)), limit-sent)]
		}
		n, err := upstream.Read(want)
		if n > 0 {
			p.forwarded.Add(int64(n))
			if _, werr := client.Write(want[:n]); werr != nil {
				return
			}
			sent += int64(n)
		}
		if limit > 0 && sent >= limit {
			p.cuts.Add(1)
			// A plain close, not a reset: a reset would make the client's
			// kernel drop what it had received but not yet read, and the
			// count would include bytes the client never saw.
			return
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				return
			}
			if tc, ok := client.(*net.TCPConn); ok {
				tc.CloseWrite()
			}
			return
		}
	}
}
