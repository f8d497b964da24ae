package fill

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/sylva-projects/osimages/internal/imagestore"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/pull"
	"github.com/sylva-projects/osimages/internal/servedset"
)

// writer is a store writer for one image, in a store of the test's own.
func writer(t *testing.T) (*imagestore.Writer, servedset.Wanted) {
	t.Helper()
	st, err := imagestore.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	sha := osimage.SHA256(strings.Repeat("a", 64))
	w, err := st.Create(sha)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Abort() })
	return w, servedset.Wanted{SHA256: sha, Key: "ubuntu"}
}

// written reads what dst holds, from its first byte.
func written(t *testing.T, dst *imagestore.Writer) string {
	t.Helper()
	r, err := dst.Tail(context.Background(), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	buf := make([]byte, dst.Size())
	if _, err := io.ReadFull(r, buf); err != nil {
		t.Fatal(err)
	}
	return string(buf)
}

// source writes content to dst and then fails with err (nil: succeeds).
func source(name, content string, err error) Func {
	return Func{Label: name, F: func(_ context.Context, _ servedset.Wanted, dst *imagestore.Writer, progress pull.Progress) (pull.Result, error) {
		if _, werr := io.WriteString(dst, content); werr != nil {
			return pull.Result{}, werr
		}
		progress(int64(len(content)), 0)
		if err != nil {
			return pull.Result{}, err
		}
		return pull.Result{Size: int64(len(content))}, nil
	}}
}

// log records the chain's calls, in order.
type log struct {
	mu    sync.Mutex
	lines []string
}

func (l *log) add(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, fmt.Sprintf(format, args...))
}

func (l *log) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "; ")
}

// chain picks, in turn, the peers that have not failed yet.
func chain(l *log, last Source, peers ...Source) Chain {
	var skip []string
	return Chain{
		Choose: func(w servedset.Wanted) Source {
			l.add("choose skip=%v", skip)
			for _, p := range peers {
				if !slices.Contains(skip, p.Name()) {
					return p
				}
			}
			return nil
		},
		Last:    last,
		Rule:    func(Source) Rule { return Rule{} },
		Started: func(_ servedset.Wanted, src Source) { l.add("start %s", src.Name()) },
		Failed: func(_ servedset.Wanted, src Source, err error) {
			l.add("failed %s: %v", src.Name(), err)
			skip = append(skip, src.Name())
		},
	}
}

// TestChainSkipsFailingPeersAndStartsAgainFromByteZero: a peer that fails
// is reported and skipped, what it wrote is discarded, and the next source
// writes from the first byte; the fill says which source filled the image.
func TestChainSkipsFailingPeersAndStartsAgainFromByteZero(t *testing.T) {
	dst, w := writer(t)
	var l log
	var progress []int64
	c := chain(&l, source("registry", "REGISTRY", errors.New("not reached")),
		source("peer a", "garbage from a", errors.New("a lies about the sha256")),
		source("peer b", "the image", nil))
	res, from, err := c.Fill(context.Background(), w, dst, func(n, _ int64) { progress = append(progress, n) })
	if err != nil {
		t.Fatal(err)
	}
	if from != "peer b" || res.Size != int64(len("the image")) {
		t.Errorf("filled from %q, %+v", from, res)
	}
	if got := written(t, dst); got != "the image" {
		t.Errorf("the store holds %q: what the failing peer wrote was not discarded", got)
	}
	want := "choose skip=[]; start peer a; failed peer a: a lies about the sha256; choose skip=[peer a]; start peer b"
	if l.String() != want {
		t.Errorf("calls:\n %s\nwant\n %s", l.String(), want)
	}
	// The progress went back to 0 when the peer's bytes were discarded.
	if !slices.Equal(progress, []int64{14, 0, 9}) {
		t.Errorf("progress %v, want [14 0 9]", progress)
	}
}

// TestChainEndsWithTheLastResort: when every peer failed, the last source
// fills; its failure is the fill's, with no further try.
func TestChainEndsWithTheLastResort(t *testing.T) {
	for _, tc := range []struct {
		name    string
		lastErr error
	}{{"the registry fills", nil}, {"the registry fails too", errors.New("registry: 503")}} {
		t.Run(tc.name, func(t *testing.T) {
			dst, w := writer(t)
			var l log
			c := chain(&l, source("registry", "from the registry", tc.lastErr),
				source("peer a", "x", errors.New("a stalls")),
				source("peer b", "y", errors.New("b is gone")))
			_, from, err := c.Fill(context.Background(), w, dst, func(int64, int64) {})
			if from != "registry" || !errors.Is(err, tc.lastErr) || (tc.lastErr == nil) != (err == nil) {
				t.Fatalf("from %q, error %v; want the registry's outcome %v", from, err, tc.lastErr)
			}
			want := "choose skip=[]; start peer a; failed peer a: a stalls; choose skip=[peer a]; start peer b; failed peer b: b is gone; choose skip=[peer a peer b]; start registry"
			if l.String() != want {
				t.Errorf("calls:\n %s\nwant\n %s", l.String(), want)
			}
			if got := written(t, dst); got != "from the registry" {
				t.Errorf("the store holds %q", got)
			}
		})
	}
}

// TestChainWithoutChooser: the last source alone, and no hook is needed.
func TestChainWithoutChooser(t *testing.T) {
	dst, w := writer(t)
	c := Chain{Last: source("registry", "bytes", nil), Rule: func(Source) Rule { return Rule{} }}
	if _, from, err := c.Fill(context.Background(), w, dst, func(int64, int64) {}); err != nil || from != "registry" {
		t.Fatalf("%q %v", from, err)
	}
}

// TestChainStopsWhenCancelled: a fill cancelled by its caller is not a
// failure of the source: no other source is tried, and none is reported.
func TestChainStopsWhenCancelled(t *testing.T) {
	dst, w := writer(t)
	var l log
	ctx, cancel := context.WithCancel(context.Background())
	waiting := Func{Label: "peer a", F: func(ctx context.Context, _ servedset.Wanted, _ *imagestore.Writer, _ pull.Progress) (pull.Result, error) {
		cancel()
		<-ctx.Done()
		return pull.Result{}, ctx.Err()
	}}
	c := chain(&l, source("registry", "x", nil), waiting)
	_, from, err := c.Fill(ctx, w, dst, func(int64, int64) {})
	if !errors.Is(err, context.Canceled) || from != "peer a" {
		t.Fatalf("from %q, %v; want peer a's cancellation", from, err)
	}
	if want := "choose skip=[]; start peer a"; l.String() != want {
		t.Errorf("calls %s, want %s", l.String(), want)
	}
}

// TestChainRunsEachSourceUnderItsRule: the rule of each source cuts it: a
// stalled peer is cut by its rule, reported with the StallError, and the
// registry fills.
func TestChainRunsEachSourceUnderItsRule(t *testing.T) {
	dst, w := writer(t)
	clk := clocktesting.NewFakeClock(time.Unix(0, 0))
	var l log
	stalled := Func{Label: "peer a", F: func(ctx context.Context, _ servedset.Wanted, _ *imagestore.Writer, _ pull.Progress) (pull.Result, error) {
		<-ctx.Done()
		return pull.Result{}, ctx.Err()
	}}
	c := chain(&l, source("registry", "bytes", nil), stalled)
	var rules []string
	c.Rule = func(s Source) Rule {
		rules = append(rules, s.Name())
		if s.Name() == "registry" {
			return Rule{}
		}
		return Rule{Stall: 5 * time.Second, StallName: "--peer-timeout", Clock: clk}
	}
	type end struct {
		from string
		err  error
	}
	done := make(chan end, 1)
	go func() {
		_, from, err := c.Fill(context.Background(), w, dst, func(int64, int64) {})
		done <- end{from, err}
	}()
	var e end
	for stepped := false; !stepped; {
		select {
		case e = <-done:
			stepped = true
		case <-time.After(time.Millisecond):
			if clk.HasWaiters() {
				clk.Step(time.Second)
			}
		}
	}
	if e.err != nil || e.from != "registry" {
		t.Fatalf("from %q, %v", e.from, e.err)
	}
	if !slices.Equal(rules, []string{"peer a", "registry"}) {
		t.Errorf("rules asked for %v", rules)
	}
	if !strings.Contains(l.String(), "failed peer a: stalled: no byte received for 5s (--peer-timeout)") {
		t.Errorf("the stall was not reported with the rule's error: %s", l.String())
	}
}

// TestChainReportsADiscardThatFails: when what a failed source wrote
// cannot be discarded, the fill ends there, with both errors, and no
// other source writes over it.
func TestChainReportsADiscardThatFails(t *testing.T) {
	dst, w := writer(t)
	var l log
	// The writer is aborted under the chain: it cannot be reset.
	breaking := Func{Label: "peer a", F: func(context.Context, servedset.Wanted, *imagestore.Writer, pull.Progress) (pull.Result, error) {
		if err := dst.Abort(); err != nil {
			t.Error(err)
		}
		return pull.Result{}, errors.New("a is gone")
	}}
	c := chain(&l, source("registry", "bytes", nil), breaking)
	_, from, err := c.Fill(context.Background(), w, dst, func(int64, int64) {})
	if err == nil || from != "" || !strings.Contains(err.Error(), "a is gone") || !strings.Contains(err.Error(), "discarding what peer a wrote") {
		t.Fatalf("from %q, %v", from, err)
	}
	if strings.Contains(l.String(), "start registry") {
		t.Errorf("the registry was started over bytes that could not be discarded: %s", l.String())
	}
}

func TestFunc(t *testing.T) {
	dst, w := writer(t)
	f := source("peer 10.0.0.1", "abc", nil)
	if f.Name() != "peer 10.0.0.1" || !strings.HasPrefix(f.Name(), FromPeerPrefix) {
		t.Errorf("name %q", f.Name())
	}
	if res, err := f.Fill(context.Background(), w, dst, func(int64, int64) {}); err != nil || res.Size != 3 {
		t.Errorf("%+v %v", res, err)
	}
}
