package serverio

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestRefusedError(t *testing.T) {
	inner := errors.New("os-images.yaml: parsing os_images document: line 3: mapping values are not allowed")
	r := &RefusedError{Reason: RefusalNearMiss, Err: inner}
	if r.Error() != inner.Error() {
		t.Errorf("Error() = %q: a refusal says what its cause says, which names the input", r.Error())
	}
	if !errors.Is(r, inner) {
		t.Error("a RefusedError does not unwrap to its cause")
	}

	// AsRefused keeps a refusal's reason, through wrapping, and calls any
	// other error a reading that failed.
	wrapped := fmt.Errorf("applying: %w", r)
	if got := AsRefused(wrapped); got != r {
		t.Errorf("AsRefused of a wrapped refusal: %+v, want the refusal itself", got)
	}
	plain := errors.New("connection refused")
	got := AsRefused(plain)
	if got.Reason != RefusalUnreadable || !errors.Is(got, plain) || got.Error() != plain.Error() {
		t.Errorf("AsRefused of a plain error: %+v", got)
	}
}

// The metrics list every reason once, and each reason is a label value.
func TestRefusalsAreDistinctLabels(t *testing.T) {
	seen := map[Refusal]bool{}
	for _, r := range Refusals {
		if seen[r] || r == "" || strings.ContainsAny(string(r), " _\"") {
			t.Errorf("reason %q: duplicate, empty, or not a plain label value", r)
		}
		seen[r] = true
	}
	for _, r := range []Refusal{RefusalUnreadable, RefusalNearMiss, RefusalEmpty, RefusalTooLarge} {
		if !seen[r] {
			t.Errorf("Refusals lacks %q", r)
		}
	}
}

const osImagesDoc = `os_images:
  ubuntu: {os: ubuntu, k8s-version: 1.32.5+rke2r1, k8s-flavor: rke2, sha256: "` + "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa" + `", filename: ubuntu.img}
`

const valuesDoc = `k8s_version: v1.32.5+rke2r1
capi_providers: {bootstrap_provider: cabpr}
capm3: {os_image_selector: {os: ubuntu}}
`

// files writes the two input files in a directory of the test's and
// returns Inputs reading them.
func files(t *testing.T, osImages, vals string) Inputs {
	t.Helper()
	dir := t.TempDir()
	in := Inputs{OSImagesFile: filepath.Join(dir, "os-images.yaml"), ValueFiles: []string{filepath.Join(dir, "values.yaml")}}
	write(t, in.OSImagesFile, osImages)
	write(t, in.ValueFiles[0], vals)
	return in
}

// write replaces path's content at once, as an operator's editor (or a
// ConfigMap volume) does.
func write(t *testing.T, path, doc string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func TestLoadFromFiles(t *testing.T) {
	in := files(t, osImagesDoc, valuesDoc)
	l, fp, err := in.Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Catalog) != 1 || l.Catalog["ubuntu"] == nil {
		t.Errorf("catalog %v", l.Catalog)
	}
	if l.Values["k8s_version"] != "v1.32.5+rke2r1" {
		t.Errorf("values %v", l.Values)
	}
	if l.Needs != nil || l.NeedsError != nil || l.NeedsDropped != nil {
		t.Errorf("needs without a fleet-needs input: %v %v %v", l.Needs, l.NeedsError, l.NeedsDropped)
	}

	// Touching a file does not change the fingerprint; changing it does,
	// in either file.
	write(t, in.OSImagesFile, osImagesDoc)
	if _, again, err := in.Load(context.Background()); err != nil || !bytes.Equal(again, fp) {
		t.Errorf("the same inputs have another fingerprint (%v)", err)
	}
	write(t, in.ValueFiles[0], valuesDoc+"extra: 1\n")
	if _, changed, err := in.Load(context.Background()); err != nil || bytes.Equal(changed, fp) {
		t.Errorf("changed values keep the fingerprint (%v)", err)
	}
	// The same values written otherwise are the same inputs: the
	// fingerprint is of what was parsed.
	write(t, in.ValueFiles[0], "capm3:\n  os_image_selector:\n    os: ubuntu\ncapi_providers:\n  bootstrap_provider: cabpr\nk8s_version: v1.32.5+rke2r1\n")
	if _, same, err := in.Load(context.Background()); err != nil || !bytes.Equal(same, fp) {
		t.Errorf("the same values, reformatted, have another fingerprint (%v)", err)
	}
}

func TestLoadRefusesBadInputsNamingThem(t *testing.T) {
	for _, c := range []struct {
		name, osImages, values string
		// reason is the refusal's, "" for an error that is not one (a
		// reading that failed: AsRefused calls it unreadable).
		reason Refusal
		says   []string
	}{
		{
			name: "os_images does not parse", osImages: "os_images: [\n", values: valuesDoc,
			says: []string{"os-images.yaml", "not YAML"},
		},
		{
			name: "a look-alike of os_images", osImages: "os_image:\n  ubuntu: {os: ubuntu}\n", values: valuesDoc,
			reason: RefusalNearMiss, says: []string{"os-images.yaml", "os_image", "os_images"},
		},
		{
			name: "os_images not a map of images", osImages: "os_images: [a, b]\n", values: valuesDoc,
			says: []string{"os-images.yaml"},
		},
		{
			name: "values do not parse", osImages: osImagesDoc, values: "capm3: {\n",
			says: []string{"values.yaml"},
		},
		{
			name: "a look-alike of capm3 in the values", osImages: osImagesDoc, values: "capm_3: {os_image_selector: {os: ubuntu}}\n",
			reason: RefusalNearMiss, says: []string{"values", "values.yaml", "capm_3", "capm3"},
		},
		{
			name: "a look-alike of os_image_selector in a level", osImages: osImagesDoc, values: "control_plane: {capm3: {os_image_selectors: {os: ubuntu}}}\n",
			reason: RefusalNearMiss, says: []string{"values.yaml", ".control_plane.capm3", "os_image_selectors"},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			in := files(t, c.osImages, c.values)
			_, _, err := in.Load(context.Background())
			if err == nil {
				t.Fatal("loaded")
			}
			r := AsRefused(err)
			want := c.reason
			if want == "" {
				want = RefusalUnreadable
			}
			if r.Reason != want {
				t.Errorf("reason %q, want %q (%v)", r.Reason, want, err)
			}
			for _, s := range c.says {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not say %q", err, s)
				}
			}
		})
	}
}

func TestLoadOfMissingFiles(t *testing.T) {
	in := files(t, osImagesDoc, valuesDoc)
	in.ValueFiles = append(in.ValueFiles, filepath.Join(t.TempDir(), "absent.yaml"))
	if _, _, err := in.Load(context.Background()); err == nil || !strings.Contains(err.Error(), "absent.yaml") {
		t.Errorf("a missing values file: %v", err)
	}
	in = files(t, osImagesDoc, valuesDoc)
	in.OSImagesFile += ".absent"
	if _, _, err := in.Load(context.Background()); err == nil || !strings.Contains(err.Error(), "os-images.yaml.absent") {
		t.Errorf("a missing os_images file: %v", err)
	}
}

// watch runs Watch in the background with a trigger of the test's, and
// records what it applies and reports.
type watch struct {
	trigger chan os.Signal
	applied chan Loaded
	done    chan error

	mu       sync.Mutex
	reports  []error
	rejectIf func(Loaded) error
}

func startWatch(t *testing.T, in Inputs) *watch {
	t.Helper()
	w := &watch{trigger: make(chan os.Signal), applied: make(chan Loaded, 16), done: make(chan error, 1)}
	in.Poll = time.Hour // reloads come from the trigger alone
	in.Report = func(err error) {
		w.mu.Lock()
		defer w.mu.Unlock()
		w.reports = append(w.reports, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() {
		cancel()
		select {
		case <-w.done:
		case <-time.After(time.Minute):
			t.Error("Watch did not return after its context ended")
		}
	})
	go func() {
		w.done <- in.Watch(ctx, w.trigger, func(l Loaded) error {
			w.mu.Lock()
			reject := w.rejectIf
			w.mu.Unlock()
			if reject != nil {
				if err := reject(l); err != nil {
					return err
				}
			}
			w.applied <- l
			return nil
		})
	}()
	return w
}

// reload triggers a reload and waits until Watch took the trigger and is
// back waiting, so that what it did is recorded.
func (w *watch) reload(t *testing.T) {
	t.Helper()
	for range 2 { // the second send is taken once the first reload ended
		select {
		case w.trigger <- os.Interrupt:
		case err := <-w.done:
			t.Fatalf("Watch returned: %v", err)
		case <-time.After(time.Minute):
			t.Fatal("Watch does not take the trigger")
		}
	}
}

func (w *watch) lastReport() (error, int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.reports) == 0 {
		return nil, 0
	}
	return w.reports[len(w.reports)-1], len(w.reports)
}

func (w *watch) nextApplied(t *testing.T) Loaded {
	t.Helper()
	select {
	case l := <-w.applied:
		return l
	case <-time.After(time.Minute):
		t.Fatal("nothing applied")
		return Loaded{}
	}
}

func (w *watch) noneApplied(t *testing.T) {
	t.Helper()
	select {
	case l := <-w.applied:
		t.Fatalf("applied %v", l.Catalog.Keys())
	default:
	}
}

// TestWatchKeepsTheLastGoodInputs: a broken edit is refused once, the
// inputs in force stay, and the fixed edit is applied.
func TestWatchKeepsTheLastGoodInputs(t *testing.T) {
	in := files(t, osImagesDoc, valuesDoc)
	w := startWatch(t, in)
	if l := w.nextApplied(t); len(l.Catalog) != 1 {
		t.Fatalf("first inputs: %v", l.Catalog)
	}

	// Touched, not changed: nothing applied again.
	write(t, in.OSImagesFile, osImagesDoc)
	w.reload(t)
	w.noneApplied(t)

	write(t, in.OSImagesFile, "os_image:\n  ubuntu: {}\n")
	w.reload(t)
	w.noneApplied(t)
	err, n := w.lastReport()
	if r := AsRefused(err); err == nil || r.Reason != RefusalNearMiss || !strings.Contains(err.Error(), "os-images.yaml") {
		t.Fatalf("the broken edit was reported as %v", err)
	}
	// The same refusal again is not reported again.
	w.reload(t)
	if _, again := w.lastReport(); again != n {
		t.Errorf("the same refusal was reported %d times", again-n+1)
	}

	// Back to the inputs in force: the refusal is over, nothing to apply.
	write(t, in.OSImagesFile, osImagesDoc)
	w.reload(t)
	w.noneApplied(t)
	if err, _ := w.lastReport(); err != nil {
		t.Errorf("after going back to the inputs in force, the last report is %v", err)
	}

	// A real change is applied.
	write(t, in.OSImagesFile, osImagesDoc+`  rocky: {os: rocky, sha256: "`+strings.Repeat("b", 64)+`", filename: rocky.img}`+"\n")
	w.reload(t)
	if l := w.nextApplied(t); len(l.Catalog) != 2 {
		t.Fatalf("after the change: %v", l.Catalog.Keys())
	}
}

// TestWatchReportsWhatApplyRefuses: an error of apply is a refusal like a
// broken file, with the reason apply gives it, and the inputs in force
// stay.
func TestWatchReportsWhatApplyRefuses(t *testing.T) {
	in := files(t, osImagesDoc, valuesDoc)
	w := startWatch(t, in)
	w.nextApplied(t)
	w.mu.Lock()
	w.rejectIf = func(l Loaded) error {
		if len(l.Catalog) == 0 {
			return &RefusedError{Reason: RefusalEmpty, Err: errors.New("the inputs select no image while 1 is served")}
		}
		return nil
	}
	w.mu.Unlock()
	write(t, in.OSImagesFile, "os_images: {}\n")
	w.reload(t)
	w.noneApplied(t)
	if err, _ := w.lastReport(); AsRefused(err).Reason != RefusalEmpty {
		t.Fatalf("reported %v, want the refusal apply made", err)
	}
}

// Before any good inputs there is nothing to keep: Watch says why at once.
func TestWatchFailsWithoutGoodInputs(t *testing.T) {
	in := files(t, "os_images: [\n", valuesDoc)
	in.Poll = time.Hour
	err := in.Watch(context.Background(), nil, func(Loaded) error {
		t.Error("applied broken inputs")
		return nil
	})
	if err == nil || !strings.Contains(err.Error(), "no last good ones") || !strings.Contains(err.Error(), "os-images.yaml") {
		t.Fatalf("Watch: %v", err)
	}
}
