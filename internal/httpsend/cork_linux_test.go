package httpsend

import (
	"net"
	"net/http"
	"net/http/httptest"
	"syscall"
	"testing"
)

// cork reads TCP_CORK on c.
func cork(t *testing.T, c *net.TCPConn) int {
	t.Helper()
	raw, err := c.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var v int
	var sockErr error
	if err := raw.Control(func(fd uintptr) {
		v, sockErr = syscall.GetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_CORK)
	}); err != nil {
		t.Fatal(err)
	}
	if sockErr != nil {
		t.Fatal(sockErr)
	}
	return v
}

// TestCorkedOverARealConnection: on a server with ConnContext, Corked sets
// TCP_CORK on the request's connection and the function it returns clears
// it, so that the last partial segment leaves at once.
func TestCorkedOverARealConnection(t *testing.T) {
	type state struct{ before, during, after int }
	got := make(chan state, 1)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, ok := r.Context().Value(connKey{}).(*net.TCPConn)
		if !ok {
			t.Errorf("ConnContext did not put the *net.TCPConn in the request's context: %T", r.Context().Value(connKey{}))
			return
		}
		var s state
		s.before = cork(t, c)
		uncork := Corked(r)
		s.during = cork(t, c)
		uncork()
		s.after = cork(t, c)
		got <- s
		_, _ = w.Write([]byte("ok"))
	}))
	srv.Config.ConnContext = ConnContext
	srv.Start()
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	s := <-got
	if s != (state{before: 0, during: 1, after: 0}) {
		t.Errorf("TCP_CORK before, during, after: %d, %d, %d; want 0, 1, 0", s.before, s.during, s.after)
	}
}

// TestCorkedOverTLS: a TLS connection is not a *net.TCPConn: Corked leaves
// it alone, and the response still arrives.
func TestCorkedOverTLS(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer Corked(r)()
		_, _ = w.Write([]byte("ok"))
	}))
	srv.Config.ConnContext = ConnContext
	srv.StartTLS()
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatal(resp.Status)
	}
}

// TestCorkedWithoutAConnection: a request whose context holds no TCP
// connection (a server without ConnContext, or a nil one) is not corked:
// Corked leaves the connection it came over as it found it, corked or not,
// and so does the function it returns.
func TestCorkedWithoutAConnection(t *testing.T) {
	conns := make(chan net.Conn, 1)
	type state struct{ during, after int }
	got := make(chan state, 2)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer close(got) // a handler that ends early fails the test, not hangs it
		c := (<-conns).(*net.TCPConn)
		for _, req := range []*http.Request{r, r.WithContext(ConnContext(r.Context(), nil))} {
			// Corked by someone else: neither Corked nor its uncork may
			// touch it.
			if err := setCork(c, true); err != nil {
				t.Error(err)
				return
			}
			uncork := Corked(req)
			var s state
			s.during = cork(t, c)
			uncork()
			s.after = cork(t, c)
			got <- s
		}
		_ = setCork(c, false)
		_, _ = w.Write([]byte("ok"))
	}))
	// No ConnContext: the handler finds the connection by ConnState.
	srv.Config.ConnState = func(c net.Conn, st http.ConnState) {
		if st == http.StateNew {
			conns <- c
		}
	}
	srv.Start()
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	for _, what := range []string{"no connection in the context", "a nil connection"} {
		if s := <-got; s != (state{during: 1, after: 1}) {
			t.Errorf("%s: TCP_CORK set by another during, after: %d, %d; want 1, 1 (untouched)", what, s.during, s.after)
		}
	}
}
