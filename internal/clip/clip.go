// Package clip bounds the text osimages writes for people, events and log
// lines, when part of it comes from input it does not control: a tenant's
// values, a registry's answer. The apiserver refuses an event note over
// 1 KiB (and the event is lost), and a log line of a megabyte drowns the
// ones around it; a clipped text keeps its beginning, which names what
// failed, and says how much was cut.
package clip

import (
	"context"
	"fmt"
	"log/slog"
	"unicode/utf8"
)

// String returns s when it holds in max bytes; else its beginning, cut on
// a character boundary, and a mark saying how long s was, max bytes in
// all.
func String(s string, max int) string {
	if len(s) <= max {
		return s
	}
	mark := fmt.Sprintf("… [clipped: %d bytes in all]", len(s))
	keep := max - len(mark)
	if keep < 0 {
		keep, mark = max, ""
	}
	for keep > 0 && !utf8.RuneStart(s[keep]) {
		keep--
	}
	return s[:keep] + mark
}

// LogValue is the bound of the message and of each value of a log line:
// far above any a component writes of its own (a catalog's failures over
// fifty images is a few KiB), far below a megabyte of a tenant's value
// quoted in an error.
const LogValue = 8 << 10

// Handler returns h with the message and every value of each record
// clipped to max bytes: strings, errors, and any other value whose text
// is longer (a list built from input), in groups too.
func Handler(h slog.Handler, max int) slog.Handler { return &handler{h: h, max: max} }

type handler struct {
	h   slog.Handler
	max int
}

func (c *handler) Enabled(ctx context.Context, l slog.Level) bool { return c.h.Enabled(ctx, l) }

func (c *handler) Handle(ctx context.Context, r slog.Record) error {
	out := slog.NewRecord(r.Time, r.Level, String(r.Message, c.max), r.PC)
	r.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(c.attr(a))
		return true
	})
	return c.h.Handle(ctx, out)
}

func (c *handler) WithAttrs(attrs []slog.Attr) slog.Handler {
	clipped := make([]slog.Attr, len(attrs))
	for i, a := range attrs {
		clipped[i] = c.attr(a)
	}
	return &handler{h: c.h.WithAttrs(clipped), max: c.max}
}

func (c *handler) WithGroup(name string) slog.Handler {
	return &handler{h: c.h.WithGroup(name), max: c.max}
}

func (c *handler) attr(a slog.Attr) slog.Attr {
	v := a.Value.Resolve()
	switch v.Kind() {
	case slog.KindString:
		if len(v.String()) > c.max {
			return slog.String(a.Key, String(v.String(), c.max))
		}
	case slog.KindGroup:
		group := v.Group()
		clipped := make([]any, len(group))
		for i, g := range group {
			clipped[i] = c.attr(g)
		}
		return slog.Group(a.Key, clipped...)
	case slog.KindAny:
		var text string
		switch x := v.Any().(type) {
		case error:
			text = x.Error()
		case fmt.Stringer:
			text = x.String()
		default:
			text = fmt.Sprint(x)
		}
		if len(text) > c.max {
			return slog.String(a.Key, String(text, c.max))
		}
		if err, ok := v.Any().(error); ok {
			// As the handlers write an error: its text.
			return slog.String(a.Key, err.Error())
		}
	}
	return slog.Attr{Key: a.Key, Value: v}
}
