package propagate

import (
	"fmt"
	"testing"
	"time"
)

// TestScale500: 500 labelled namespaces get their copies, and a source
// change reaches all of them, within the "seconds".
func TestScale500(t *testing.T) {
	const n = 500
	e := newEnv(t)
	e.writeSource("v1")
	names := e.createNamespaces("scale", n)
	start := time.Now()
	ctl := e.start(Options{})
	e.waitCopies(names, "v1", 60*time.Second)
	t.Logf("%d copies created in %s from the controller's start", n, time.Since(start).Round(time.Millisecond))

	start = time.Now()
	e.writeSource("v2")
	e.waitCopies(names, "v2", 30*time.Second)
	took := time.Since(start)
	t.Logf("source change reached %d copies in %s", n, took.Round(time.Millisecond))

	eventually(t, settle, func() error {
		if got := ctl.copies(t, e.rule.Name, StateInSync); got != n {
			return fmt.Errorf("in_sync %v", got)
		}
		return nil
	})
	if w := ctl.writes(t, e.rule.Name); w != 2*n {
		t.Errorf("%v writes for %d creates and %d updates: some copy was written twice", w, n, n)
	}
	if errs := ctl.metric(t, "osimages_propagate_reconcile_errors_total", map[string]string{"rule": e.rule.Name}); errs != 0 {
		t.Errorf("%v reconcile errors", errs)
	}
}
