package osimage

import (
	"errors"
	"strings"
	"testing"
)

func TestCheckConfigMapSize(t *testing.T) {
	// The apiserver counts the values, not the keys, and refuses above
	// 1 MiB: exactly 1 MiB passes.
	full := map[string]string{ValuesKey: strings.Repeat("x", MaxConfigMapBytes-10), "other": strings.Repeat("y", 10)}
	if err := CheckConfigMapSize("ConfigMap ns/x", full, 3); err != nil {
		t.Errorf("exactly 1 MiB: %v", err)
	}
	full["other"] += "y"
	err := CheckConfigMapSize("ConfigMap ns/x", full, 1700)
	var size *SizeError
	if !errors.As(err, &size) || size.Bytes != MaxConfigMapBytes+1 || size.Images != 1700 {
		t.Fatalf("one byte over: %v", err)
	}
	for _, want := range []string{"ConfigMap ns/x would hold 1048577 bytes (1.00 MiB) for 1700 images", "over the 1048576 bytes (1 MiB) a ConfigMap can hold", "nothing was written"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q lacks %q", err, want)
		}
	}
}
