//go:build unix

package httpsend

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// bufferSize is the socket buffer size of both ends in the tests over a
// real connection: with the kernel's autotuned buffers, megabytes of a
// response would sit in them, and a client that stops reading would not
// stop the server's writes for a while.
const bufferSize = 256 << 10

// setBuffers sets SO_SNDBUF and SO_RCVBUF before the socket connects or
// listens; an accepted socket inherits the listener's.
func setBuffers(_, _ string, c syscall.RawConn) error {
	var err error
	if cerr := c.Control(func(fd uintptr) {
		if err = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_SNDBUF, bufferSize); err != nil {
			return
		}
		err = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, bufferSize)
	}); cerr != nil {
		return cerr
	}
	return err
}

// served is a file served by a test server the way the image server sends
// one: Deadline around a handler that wraps the writer in a Writer, corks
// the connection and hands the file to http.ServeContent, which gives it
// to the Writer's ReadFrom.
type served struct {
	url  string
	size int64
	data []byte
	// done receives once per request, when its handler returned.
	done chan struct{}
}

// serveFile starts a server on 127.0.0.1 with small socket buffers that
// serves size random bytes under timeout. wrap says whether the handler
// uses a Writer (false: Deadline alone).
func serveFile(t *testing.T, size int64, timeout time.Duration, wrap bool) *served {
	t.Helper()
	data := make([]byte, size)
	if _, err := rand.Read(data); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "image")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	s := &served{size: size, data: data, done: make(chan struct{}, 4)}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() { s.done <- struct{}{} }()
		f, err := os.Open(path)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		defer f.Close()
		if wrap {
			defer Corked(r)()
			w = &Writer{ResponseWriter: w, Timeout: timeout}
		}
		http.ServeContent(w, r, "image", time.Time{}, f)
	})
	lc := net.ListenConfig{Control: setBuffers}
	ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(Deadline(timeout, handler))
	srv.Listener.Close()
	srv.Listener = ln
	srv.Config.ConnContext = ConnContext
	srv.Start()
	t.Cleanup(srv.Close)
	s.url = srv.URL + "/image"
	return s
}

// get sends a GET for s over a connection with small buffers and returns
// the response, whose body the caller reads at its own pace.
func (s *served) get(t *testing.T) *http.Response {
	t.Helper()
	client := &http.Client{Transport: &http.Transport{
		DialContext:        (&net.Dialer{Control: setBuffers}).DialContext,
		DisableCompression: true,
	}}
	t.Cleanup(client.CloseIdleConnections)
	resp, err := client.Get(s.url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	if resp.StatusCode != http.StatusOK || resp.ContentLength != s.size {
		t.Fatalf("GET %s: %s, Content-Length %d, want 200 and %d", s.url, resp.Status, resp.ContentLength, s.size)
	}
	return resp
}

// waitHandler waits for the handler of the request to return; a minute
// is far more than any deadline of these tests.
func (s *served) waitHandler(t *testing.T, what string) {
	t.Helper()
	select {
	case <-s.done:
	case <-time.After(time.Minute):
		t.Fatalf("%s: the handler still sends after a minute", what)
	}
}

// steadyRead reads body in chunks of chunk bytes with a pause after each
// but the last: a client that is now and then still, never for long. It
// returns what it read; a short read at the end is the caller's to judge
// by the length, for io.ReadFull tells a short last chunk and a cut body
// alike.
func steadyRead(body io.Reader, size int64, chunk int, pause time.Duration) ([]byte, error) {
	var got bytes.Buffer
	buf := make([]byte, chunk)
	for {
		n, err := io.ReadFull(body, buf)
		got.Write(buf[:n])
		switch {
		case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
			return got.Bytes(), nil
		case err != nil:
			return got.Bytes(), err
		}
		if int64(got.Len()) < size {
			time.Sleep(pause)
		}
	}
}

// TestStalledClientIsCut: a client that asks for a file and never reads
// it is cut once the send timeout passes without progress: the handler
// returns, and the client then reads less than the file, with an error.
func TestStalledClientIsCut(t *testing.T) {
	const size = 16 << 20
	s := serveFile(t, size, 300*time.Millisecond, true)
	resp := s.get(t)
	s.waitHandler(t, "a client that reads nothing")
	got, err := io.ReadAll(resp.Body)
	if err == nil || int64(len(got)) >= size {
		t.Fatalf("a stalled client read %d of %d bytes, error %v: want the response cut", len(got), size, err)
	}
}

// The client of the two tests below reads 4 MiB, then stops for 600 ms,
// five times. A piece of the file (2 MiB) waits for one pause at most:
// with the time to send it, far under a timeout of 2 s. The pauses add up
// to 2.4 s, and the last is taken with more of the file left to send
// than the socket buffers hold: a deadline counted from the start of the
// response, and not from the last piece, cuts it, however fast the
// machine.
const (
	steadySize    = 20 << 20
	steadyChunk   = 4 << 20
	steadyPause   = 600 * time.Millisecond
	steadyTimeout = 2 * time.Second
)

// TestSteadyClientIsNotCut: a client slower than the timeout over the
// whole file, but never still for the timeout, gets every byte.
func TestSteadyClientIsNotCut(t *testing.T) {
	s := serveFile(t, steadySize, steadyTimeout, true)
	resp := s.get(t)
	start := time.Now()
	got, err := steadyRead(resp.Body, steadySize, steadyChunk, steadyPause)
	if err != nil || !bytes.Equal(got, s.data) {
		t.Fatalf("a steady client got %d of %d bytes in %s (timeout %s), error %v", len(got), steadySize, time.Since(start), steadyTimeout, err)
	}
	if took := time.Since(start); took <= steadyTimeout {
		t.Fatalf("the download took %s, not over the timeout %s: the test proves nothing", took, steadyTimeout)
	}
	s.waitHandler(t, "a complete response")
}

// TestDeadlineAloneBoundsTheWholeResponse: without a Writer to extend it,
// Deadline's first deadline holds for the whole response, so the same
// steady client is cut. This is why the file handler wraps its writer:
// the test above passes because of the Writer.
func TestDeadlineAloneBoundsTheWholeResponse(t *testing.T) {
	s := serveFile(t, steadySize, steadyTimeout, false)
	resp := s.get(t)
	got, err := steadyRead(resp.Body, steadySize, steadyChunk, steadyPause)
	if err == nil && len(got) == steadySize {
		t.Fatalf("a response that lasts over %s was not cut by a deadline of %s from its start", 4*steadyPause, steadyTimeout)
	}
	s.waitHandler(t, "a cut response")
}

// TestWriteToAStalledClientIsCut: Deadline bounds a handler that writes
// with Write, not ReadFrom, to a client that does not read; with a Writer,
// whose Write extends the deadline per call, the stalled client is cut all
// the same.
func TestWriteToAStalledClientIsCut(t *testing.T) {
	for _, wrap := range []bool{false, true} {
		t.Run(fmt.Sprintf("writer=%v", wrap), func(t *testing.T) {
			ended := make(chan error, 1)
			handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if wrap {
					w = &Writer{ResponseWriter: w, Timeout: 200 * time.Millisecond}
				}
				chunk := make([]byte, 64<<10)
				for i := 0; i < 1024; i++ { // 64 MiB at most
					if _, err := w.Write(chunk); err != nil {
						ended <- err
						return
					}
				}
				ended <- nil
			})
			lc := net.ListenConfig{Control: setBuffers}
			ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			srv := httptest.NewUnstartedServer(Deadline(200*time.Millisecond, handler))
			srv.Listener.Close()
			srv.Listener = ln
			srv.Start()
			t.Cleanup(srv.Close)
			conn, err := (&net.Dialer{Control: setBuffers}).Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if _, err := fmt.Fprintf(conn, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-ended:
				if err == nil {
					t.Fatal("64 MiB written to a client that reads nothing")
				}
			case <-time.After(time.Minute):
				t.Fatal("the handler still writes after a minute")
			}
		})
	}
}

// pieces is a ResponseWriter that can ReadFrom, as net/http's response
// can, and records each call's limit and what it read.
type pieces struct {
	*httptest.ResponseRecorder
	limits []int64
	got    bytes.Buffer
	// fail, when set, is returned by the call of that index (from 1).
	fail  int
	empty bool
	// deadline is the last write deadline set; deadlines are the ones in
	// force at each ReadFrom call, and calls the times of the calls.
	deadline  time.Time
	deadlines []time.Time
	calls     []time.Time
}

// SetWriteDeadline is what http.ResponseController calls.
func (p *pieces) SetWriteDeadline(d time.Time) error {
	p.deadline = d
	return nil
}

func newPieces() *pieces { return &pieces{ResponseRecorder: httptest.NewRecorder()} }

func (p *pieces) ReadFrom(r io.Reader) (int64, error) {
	lr, ok := r.(*io.LimitedReader)
	if !ok {
		return 0, errors.New("ReadFrom was given a reader without a limit")
	}
	p.limits = append(p.limits, lr.N)
	p.calls = append(p.calls, time.Now())
	p.deadlines = append(p.deadlines, p.deadline)
	if p.empty {
		return 0, nil
	}
	if len(p.limits) == p.fail {
		n, _ := io.CopyN(&p.got, lr, lr.N/2)
		return n, errors.New("connection reset")
	}
	return io.Copy(&p.got, lr)
}

// TestReadFromSendsInPieces: a file handed to ReadFrom with a limit goes
// to the writer below in pieces of at most sendPiece, in order, and not a
// byte past the limit is read from the file.
func TestReadFromSendsInPieces(t *testing.T) {
	for _, n := range []int64{0, 1, sendPiece - 1, sendPiece, sendPiece + 1, 3*sendPiece + 12345} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			src := make([]byte, n+100) // the file goes on past the range
			if _, err := rand.Read(src); err != nil {
				t.Fatal(err)
			}
			p := newPieces()
			w := &Writer{ResponseWriter: p, Timeout: time.Second}
			file := bytes.NewReader(src)
			total, err := w.ReadFrom(&io.LimitedReader{R: file, N: n})
			if err != nil || total != n {
				t.Fatalf("ReadFrom: %d, %v; want %d", total, err, n)
			}
			if !bytes.Equal(p.got.Bytes(), src[:n]) {
				t.Fatal("the bytes sent are not the file's range")
			}
			if rest := file.Len(); rest != 100 {
				t.Errorf("%d bytes of the file left unread, want 100: ReadFrom read past its limit", rest)
			}
			wantCalls := int((n + sendPiece - 1) / sendPiece)
			if len(p.limits) != wantCalls {
				t.Errorf("%d calls below (limits %v), want %d", len(p.limits), p.limits, wantCalls)
			}
			for i, l := range p.limits {
				if l > sendPiece || l <= 0 {
					t.Errorf("piece %d has limit %d, want 1..%d", i, l, sendPiece)
				}
			}
		})
	}
}

// TestEachPieceGetsItsOwnDeadline: before each piece, and each Write, the
// write deadline moves to the timeout from then: the time a piece may take
// does not shrink with the pieces before it. With a timeout of an hour,
// a deadline less than 59 minutes after a call began was not set for it.
func TestEachPieceGetsItsOwnDeadline(t *testing.T) {
	const timeout = time.Hour
	p := newPieces()
	w := &Writer{ResponseWriter: p, Timeout: timeout}
	start := time.Now()
	if _, err := w.ReadFrom(&io.LimitedReader{R: bytes.NewReader(make([]byte, 3*sendPiece)), N: 3 * sendPiece}); err != nil {
		t.Fatal(err)
	}
	if len(p.deadlines) != 3 {
		t.Fatalf("%d pieces, want 3", len(p.deadlines))
	}
	for i, d := range p.deadlines {
		if d.Sub(p.calls[i]) < timeout-time.Minute || d.Sub(p.calls[i]) > timeout {
			t.Errorf("piece %d began %s after the start with a deadline %s after it, want about %s", i, p.calls[i].Sub(start), d.Sub(p.calls[i]), timeout)
		}
		if i > 0 && d.Before(p.deadlines[i-1]) {
			t.Errorf("piece %d has an earlier deadline than piece %d", i, i-1)
		}
	}

	p.deadline = time.Time{}
	before := time.Now()
	if _, err := w.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if p.deadline.Sub(before) < timeout-time.Minute {
		t.Errorf("Write set the deadline %s ahead, want about %s", p.deadline.Sub(before), timeout)
	}
}

// TestDeadlineSetsTheFirstDeadline: Deadline gives the response its first
// write deadline before the handler runs, so that a handler stuck on a
// client before its first piece is bounded too.
func TestDeadlineSetsTheFirstDeadline(t *testing.T) {
	const timeout = time.Hour
	p := newPieces()
	var seen time.Time
	before := time.Now()
	Deadline(timeout, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		seen = w.(*pieces).deadline
	})).ServeHTTP(p, httptest.NewRequest(http.MethodGet, "/", nil))
	if seen.Sub(before) < timeout-time.Minute || seen.Sub(before) > timeout+time.Minute {
		t.Fatalf("the handler ran with a deadline %s ahead, want about %s", seen.Sub(before), timeout)
	}
}

// TestReadFromStopsAtAnError: an error of the writer below ends ReadFrom
// with the bytes sent so far, and nothing more is sent.
func TestReadFromStopsAtAnError(t *testing.T) {
	p := newPieces()
	p.fail = 2
	w := &Writer{ResponseWriter: p, Timeout: time.Second}
	total, err := w.ReadFrom(&io.LimitedReader{R: bytes.NewReader(make([]byte, 4*sendPiece)), N: 4 * sendPiece})
	if err == nil || err.Error() != "connection reset" {
		t.Fatalf("error %v, want the writer's", err)
	}
	if want := int64(sendPiece + sendPiece/2); total != want || int64(p.got.Len()) != want {
		t.Errorf("ReadFrom says %d bytes, the writer got %d, want %d", total, p.got.Len(), want)
	}
	if len(p.limits) != 2 {
		t.Errorf("%d calls after an error, want 2", len(p.limits))
	}
}

// TestReadFromWithoutProgressEnds: a writer below that takes nothing (a
// file shorter than its stated size) does not make ReadFrom spin.
func TestReadFromWithoutProgressEnds(t *testing.T) {
	p := newPieces()
	p.empty = true
	w := &Writer{ResponseWriter: p, Timeout: time.Second}
	total, err := w.ReadFrom(&io.LimitedReader{R: strings.NewReader(""), N: 10})
	if err != nil || total != 0 || len(p.limits) != 1 {
		t.Fatalf("ReadFrom: %d, %v after %d calls; want 0, nil after 1", total, err, len(p.limits))
	}
}

// TestReadFromWithoutLimitOrSendfile: a reader without a limit, or a
// writer below that cannot ReadFrom, is copied with Write, whole.
func TestReadFromWithoutLimitOrSendfile(t *testing.T) {
	data := bytes.Repeat([]byte("0123456789"), sendPiece/5)
	t.Run("no limit", func(t *testing.T) {
		p := newPieces()
		w := &Writer{ResponseWriter: p, Timeout: time.Second}
		n, err := w.ReadFrom(bytes.NewReader(data))
		if err != nil || n != int64(len(data)) || !bytes.Equal(p.Body.Bytes(), data) || len(p.limits) != 0 {
			t.Fatalf("ReadFrom: %d, %v; body %d bytes, %d ReadFrom calls below", n, err, p.Body.Len(), len(p.limits))
		}
	})
	t.Run("no ReadFrom below", func(t *testing.T) {
		rec := httptest.NewRecorder()
		w := &Writer{ResponseWriter: rec, Timeout: time.Second}
		n, err := w.ReadFrom(&io.LimitedReader{R: bytes.NewReader(data), N: 12345})
		if err != nil || n != 12345 || !bytes.Equal(rec.Body.Bytes(), data[:12345]) {
			t.Fatalf("ReadFrom: %d, %v; body %d bytes", n, err, rec.Body.Len())
		}
	})
}

// TestWriterUnwraps: http.ResponseController reaches the connection
// through a Writer, which is how Writer's own deadlines and a handler's
// Flush get there.
func TestWriterUnwraps(t *testing.T) {
	rec := httptest.NewRecorder()
	w := &Writer{ResponseWriter: rec, Timeout: time.Second}
	if w.Unwrap() != rec {
		t.Fatal("Unwrap does not return the writer below")
	}
	if err := http.NewResponseController(w).Flush(); err != nil {
		t.Fatalf("Flush through a Writer: %v", err)
	}
	if !rec.Flushed {
		t.Error("the recorder below was not flushed")
	}
}
