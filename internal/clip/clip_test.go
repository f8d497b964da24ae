package clip

import (
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
