package kube

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/sylva-projects/osimages/internal/clip"
)

// ValidateListenAddress refuses what cannot be listened on: it wants
// [HOST]:PORT, the port a number.
func ValidateListenAddress(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err == nil {
		var n uint64
		if n, err = strconv.ParseUint(port, 10, 16); err == nil && n > 65535 {
			err = errors.New("port out of range")
		}
	}
	if err != nil {
		return fmt.Errorf("listen address %q: want [HOST]:PORT, such as :8080 or 127.0.0.1:8080 (%v)", addr, err)
	}
	return nil
}

// NewLogger returns the structured log in format (json or text) at
// verbosity, each value clipped (clip.LogValue): errors quote tenant
// values and registry answers. Its error quotes format; the caller names
// where format came from.
func NewLogger(w io.Writer, format string, verbosity int) (logr.Logger, error) {
	// logr's V(n) is slog level -n.
	opts := &slog.HandlerOptions{Level: slog.Level(-verbosity)}
	switch format {
	case "json":
		return logr.FromSlogHandler(clip.Handler(slog.NewJSONHandler(w, opts), clip.LogValue)), nil
	case "text":
		return logr.FromSlogHandler(clip.Handler(slog.NewTextHandler(w, opts), clip.LogValue)), nil
	}
	return logr.Logger{}, fmt.Errorf("%q: want json or text", format)
}

// Quantity reads s as a Kubernetes quantity (500Gi); "" is 0. Its error
// starts with name, which says where s came from.
func Quantity(name, s string) (int64, error) {
	if s == "" {
		return 0, nil
	}
	q, err := resource.ParseQuantity(s)
	if err != nil {
		return 0, fmt.Errorf("%s %q: want a quantity such as 500Gi: %w", name, s, err)
	}
	return q.Value(), nil
}
