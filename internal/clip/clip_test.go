package clip

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestString(t *testing.T) {
	if got := String("short", 10); got != "short" {
		t.Errorf("a text within the bound changed: %q", got)
	}
	long := strings.Repeat("é", 1000) // 2,000 bytes
	for _, max := range []int{1024, 100, 31, 5, 1, 0} {
		got := String(long, max)
		if len(got) > max || !utf8.ValidString(got) {
			t.Errorf("max %d: %d bytes, valid UTF-8 %v", max, len(got), utf8.ValidString(got))
		}
		if max >= 100 && (!strings.HasPrefix(got, "éé") || !strings.HasSuffix(got, "[clipped: 2000 bytes in all]")) {
			t.Errorf("max %d: %q does not keep the beginning and say what was cut", max, got)
		}
	}
}

func TestHandler(t *testing.T) {
	big := strings.Repeat("b", 100_000)
	var out strings.Builder
	log := slog.New(Handler(slog.NewJSONHandler(&out, nil), 1000)).With("context", big).WithGroup("g")
	log.Error("msg "+big, "error", errors.New(big), "list", []string{big}, slog.Group("inner", "value", big), "small", []int{1, 2}, "n", 3)
	line := out.String()
	if len(line) > 7*1000 {
		t.Errorf("a line of %d bytes", len(line))
	}
	if got := strings.Count(line, "[clipped: "); got != 5 {
		t.Errorf("%d values clipped, want 5 (message, context, error, list, group value)", got)
	}
	if !strings.Contains(line, `"small":[1,2]`) || !strings.Contains(line, `"n":3`) {
		t.Errorf("small values changed: %.500s", line)
	}
}

// The bound is exact: a text of max bytes is kept whole, one byte more is
// clipped to max bytes at most; a bound shorter than the mark keeps what
// fits, without a mark.
func TestStringAtTheBound(t *testing.T) {
	s := strings.Repeat("a", 100)
	if got := String(s, 100); got != s {
		t.Errorf("a text of exactly max bytes was clipped: %q", got)
	}
	got := String(s+"b", 100)
	if len(got) > 100 || !strings.HasSuffix(got, "[clipped: 101 bytes in all]") || !strings.HasPrefix(got, "aaa") {
		t.Errorf("one byte over: %q (%d bytes)", got, len(got))
	}
	if got := String(s, 10); got != "aaaaaaaaaa" {
		t.Errorf("a bound shorter than the mark: %q", got)
	}
	// A multi-byte character is never split, whatever the bound.
	for max := 30; max < 40; max++ {
		if got := String(strings.Repeat("€", 50), max); !utf8.ValidString(got) || len(got) > max {
			t.Errorf("max %d: %q", max, got)
		}
	}
}

// big is a value whose text is long only once formatted: a list built
// from input.
type big []string

func (b big) String() string { return strings.Join(b, ",") }

// lazy is a LogValuer that resolves to a long string.
type lazy struct{}

func (lazy) LogValue() slog.Value { return slog.StringValue(strings.Repeat("z", 5000)) }

func TestHandlerResolvesAndKeepsSmallValues(t *testing.T) {
	var out strings.Builder
	log := slog.New(Handler(slog.NewTextHandler(&out, nil), 200))
	log.Info("m", "stringer", big{strings.Repeat("s", 300), "t"}, "lazy", lazy{}, "err", errors.New("small error"), "ok", "fine")
	line := out.String()
	if strings.Count(line, "[clipped: ") != 2 {
		t.Errorf("want the Stringer and the LogValuer clipped: %s", line)
	}
	if strings.Contains(line, strings.Repeat("z", 201)) || strings.Contains(line, strings.Repeat("s", 201)) {
		t.Errorf("a value over the bound: %s", line)
	}
	if !strings.Contains(line, `err="small error"`) || !strings.Contains(line, "ok=fine") {
		t.Errorf("small values changed: %s", line)
	}
}

// The handler asks the one below whether a level is on: a clipped debug
// line is not even formatted when debug is off.
func TestHandlerEnabled(t *testing.T) {
	var out strings.Builder
	h := Handler(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelWarn}), 100)
	if h.Enabled(context.Background(), slog.LevelInfo) || !h.Enabled(context.Background(), slog.LevelError) {
		t.Error("Enabled does not follow the handler below")
	}
	slog.New(h).Info(strings.Repeat("x", 1000))
	if out.Len() != 0 {
		t.Errorf("an info line was written at warn: %s", out.String())
	}
	// Attributes given before a group are clipped too.
	slog.New(h).With("before", strings.Repeat("b", 1000)).WithGroup("g").Warn("w", "after", strings.Repeat("a", 1000))
	if line := out.String(); strings.Count(line, "[clipped: 1000 bytes in all]") != 2 || !strings.Contains(line, "g.after=") {
		t.Errorf("clipped in and out of a group: %s", line)
	}
}
