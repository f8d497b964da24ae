// Package httpsend sends files over HTTP as nginx does: in sendfile
// pieces on a corked socket, under a send timeout that bounds the time
// without progress rather than the time of the download.
package httpsend

import (
	"context"
	"io"
	"net"
	"net/http"
	"time"
)

// sendPiece is how much of a file one sendfile call is given. With the
// socket corked, pieces this size end in full segments, as nginx's
// sendfile_max_chunk with tcp_nopush does; one call for the whole file
// instead stops wherever the socket buffer fills and flushes a partial
// segment each time, about 14% more packets for the same bytes.
const sendPiece = 2 << 20

type connKey struct{}

// ConnContext is set as http.Server.ConnContext so that the image handler can
// cork the connection it sends a file on.
func ConnContext(ctx context.Context, c net.Conn) context.Context {
	return context.WithValue(ctx, connKey{}, c)
}

// Corked sets TCP_CORK on the request's connection, when it is plain TCP,
// and returns the function that clears it. Clearing sends the last partial
// segment at once; a cork left set would hold it for 200 ms.
func Corked(r *http.Request) func() {
	tcp, ok := r.Context().Value(connKey{}).(*net.TCPConn)
	if !ok {
		return func() {}
	}
	if setCork(tcp, true) != nil {
		return func() {}
	}
	return func() { _ = setCork(tcp, false) }
}

// Writer splits the file http.ServeContent hands to ReadFrom into
// sendPiece pieces, each still sent with sendfile by the writer below, and
// gives each piece (or each Write, where there is no sendfile) a write
// deadline of timeout from its start: a client reading at any pace above
// sendPiece per timeout gets the whole file, one that stops reading is cut
// after timeout.
type Writer struct {
	http.ResponseWriter
	Timeout time.Duration
}

func (w *Writer) extend() {
	_ = http.NewResponseController(w.ResponseWriter).SetWriteDeadline(time.Now().Add(w.Timeout))
}

func (w *Writer) Write(p []byte) (int, error) {
	w.extend()
	return w.ResponseWriter.Write(p)
}

func (w *Writer) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *Writer) ReadFrom(r io.Reader) (int64, error) {
	rf, ok := w.ResponseWriter.(io.ReaderFrom)
	lr, limited := r.(*io.LimitedReader)
	if !ok || !limited {
		return io.Copy(struct{ io.Writer }{w}, r)
	}
	var total int64
	for lr.N > 0 {
		w.extend()
		n, err := rf.ReadFrom(&io.LimitedReader{R: lr.R, N: min(lr.N, sendPiece)})
		total += n
		lr.N -= n
		if err != nil {
			return total, err
		}
		if n == 0 {
			break
		}
	}
	return total, nil
}

// Deadline gives each request's response a first write deadline of
// timeout; Writer extends it as the response makes progress.
func Deadline(timeout time.Duration, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(timeout))
		next.ServeHTTP(w, r)
	})
}
