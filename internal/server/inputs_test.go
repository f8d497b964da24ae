package server

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/sylva-projects/osimages/internal/imagestore"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/servedset"
	"github.com/sylva-projects/osimages/internal/serverio"
	"github.com/sylva-projects/osimages/internal/testenv"
)

// TestServesEveryFilenameOfAnImage: two keys name one sha256 under two
// filenames; both URLs answer from the one stored file, each checksum
// file names the file asked for, and any other name is 404.
func TestServesEveryFilenameOfAnImage(t *testing.T) {
	src := newFakeSource()
	content := []byte(strings.Repeat("disk image ", 1000))
	a := src.add("good", content, false)
	a.Filenames = []string{"good.raw", "renamed.raw"}
	h := start(t, t.TempDir(), src, nil)
	h.want(a)
	h.waitPhase(a.SHA256, PhaseReady)
	for _, name := range a.Filenames {
		resp, body := h.get("/images/" + a.SHA256.String() + "/" + name)
		if resp.StatusCode != http.StatusOK || string(body) != string(content) {
			t.Errorf("GET %s: %d, %d bytes", name, resp.StatusCode, len(body))
		}
		resp, body = h.get("/images/" + a.SHA256.String() + "/" + name + ".sha256sum")
		if want := a.SHA256.String() + "  " + name + "\n"; resp.StatusCode != http.StatusOK || string(body) != want {
			t.Errorf("GET %s.sha256sum: %d %q, want %q", name, resp.StatusCode, body, want)
		}
		resp, body = h.get("/images/" + a.SHA256.String() + "/" + name + ".md5sum")
		if want := a.Desc.MD5 + "  " + name + "\n"; resp.StatusCode != http.StatusOK || string(body) != want {
			t.Errorf("GET %s.md5sum: %d %q, want %q", name, resp.StatusCode, body, want)
		}
	}
	for _, name := range []string{"other.raw", "good.raw.sha512sum", "renamed"} {
		if resp, _ := h.get("/images/" + a.SHA256.String() + "/" + name); resp.StatusCode != http.StatusNotFound {
			t.Errorf("GET %s: %d, want 404", name, resp.StatusCode)
		}
	}
	if _, page := h.get("/"); !strings.Contains(string(page), `href="/images/`+a.SHA256.String()+`/renamed.raw"`) {
		t.Errorf("the status page does not list the second filename:\n%s", page)
	}
}

// writeInputs writes the os_images document and the values file, each
// atomically, so that the poller never reads half a file.
func writeInputs(t *testing.T, osImages, vals, osImagesDoc, valuesDoc string) {
	t.Helper()
	for path, doc := range map[string]string{osImages: osImagesDoc, vals: valuesDoc} {
		if old, err := os.ReadFile(path); err == nil && string(old) == doc {
			continue
		}
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
}

func newTestStore(t *testing.T) *imagestore.Store {
	t.Helper()
	store, err := imagestore.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	return store
}

func catalogDoc(t *testing.T, ws ...servedset.Wanted) string {
	t.Helper()
	cat := osimage.Catalog{}
	for _, w := range ws {
		d := w.Desc
		cat[w.Key] = osimage.Image{"sha256": w.SHA256.String(), "filename": d.Filename, "md5": d.MD5, "uri": d.URI, "os": "ubuntu",
			"size": fmt.Sprint(d.Size), "archive-size": fmt.Sprint(d.ArchiveSize)}
	}
	doc, err := osimage.MarshalInfo(cat)
	if err != nil {
		t.Fatal(err)
	}
	return string(doc)
}

// TestWatchRefusesBrokenInputs drives Inputs.Watch over files, as serve
// does: every broken edit is refused, reported (status, page, metric) and
// changes nothing served; good inputs are taken again.
func TestWatchRefusesBrokenInputs(t *testing.T) {
	src := newFakeSource()
	a := src.add("ubuntu-a", []byte("image a"), false)
	h := start(t, t.TempDir(), src, nil)
	dir := t.TempDir()
	osImages, vals := filepath.Join(dir, "os-images.yaml"), filepath.Join(dir, "values.yaml")
	goodImages := catalogDoc(t, a)
	const goodValues = "os_image_server_additional_selectors:\n  all: {os: ubuntu}\n"
	writeInputs(t, osImages, vals, goodImages, goodValues)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	in := serverio.Inputs{OSImagesFile: osImages, ValueFiles: []string{vals}, Poll: 10 * time.Millisecond, Report: h.srv.ReportInputs}
	watchErr := make(chan error, 1)
	go func() {
		watchErr <- in.Watch(ctx, nil, func(l serverio.Loaded) error {
			wanted, _ := servedset.Select(l.Values, l.Catalog)
			if err := h.srv.Admit(ctx, wanted); err != nil {
				return err
			}
			h.srv.SetDesired(wanted, nil)
			return nil
		})
	}()
	h.waitPublished(a.SHA256, true)

	for _, tc := range []struct {
		name, osImages, values string
		reason                 serverio.Refusal
		says                   string
	}{
		{"emptied os_images file", "", goodValues, serverio.RefusalEmpty, "the inputs select no image, while 1 are served"},
		{"os_images: null (half-written)", "os_images:\n", goodValues, serverio.RefusalEmpty, "--allow-empty"},
		{"os_images: {}", "os_images: {}\n", goodValues, serverio.RefusalEmpty, "select no image"},
		{"os_image typed for os_images", strings.Replace(goodImages, "os_images:", "os_image:", 1), goodValues, serverio.RefusalNearMiss, "os_image: did you mean os_images?"},
		{"unparsable", "os_images: [\n", goodValues, serverio.RefusalUnreadable, "os-images.yaml: not YAML"},
		{"emptied values", goodImages, "", serverio.RefusalEmpty, "select no image"},
		{"misspelt additional selectors", goodImages, strings.Replace(goodValues, "selectors", "selector", 1), serverio.RefusalNearMiss, "os_image_server_additional_selector: did you mean os_image_server_additional_selectors?"},
		{"values typo of a cosign key", goodImages, goodValues + "os_images_oci_registries:\n  sylva: {url: oci://r/x, cosign_public_key: k}\n", serverio.RefusalNearMiss, "did you mean cosign_publickey?"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			writeInputs(t, osImages, vals, tc.osImages, tc.values)
			testenv.Poll(t, fmt.Sprint("refused as ", tc.reason), 10*time.Second, 5*time.Millisecond, func() (bool, string) {
				st := h.srv.InputsStatus()
				return st.Refused != nil && st.Refused.Reason == tc.reason, fmt.Sprintf("%+v", st)
			})
			if msg := h.srv.InputsStatus().Refused.Error(); !strings.Contains(msg, tc.says) {
				t.Errorf("refusal %q does not say %q", msg, tc.says)
			}
			if s := h.srv.Served(); !s[a.SHA256].Available || len(s) != 1 {
				t.Errorf("the served set changed: %v", s)
			}
			if resp, _ := h.get(imageURL(a)); resp.StatusCode != http.StatusOK {
				t.Errorf("image answers %d", resp.StatusCode)
			}
			_, page := h.get("/")
			if !strings.Contains(string(page), `id="inputs-refused"`) || !strings.Contains(string(page), "the last good inputs stay in force") {
				t.Errorf("status page does not say the inputs are refused:\n%s", page)
			}
			_, metrics := h.get("/metrics")
			if want := fmt.Sprintf("osimages_inputs_refused{reason=%q} 1", tc.reason); !strings.Contains(string(metrics), want) {
				t.Errorf("metrics lack %s", want)
			}
			// Good inputs again: in force, nothing refused.
			writeInputs(t, osImages, vals, goodImages, goodValues)
			testenv.Poll(t, "the good inputs taken again", 10*time.Second, 5*time.Millisecond, func() (bool, string) {
				st := h.srv.InputsStatus()
				return st.Refused == nil, fmt.Sprintf("%+v", st)
			})
		})
	}
	st := h.srv.InputsStatus()
	if st.Refusals[serverio.RefusalEmpty] != 4 || st.Refusals[serverio.RefusalNearMiss] != 3 || st.Refusals[serverio.RefusalUnreadable] != 1 {
		t.Errorf("each refusal counts once: %v", st.Refusals)
	}
	// The image stayed selected all along: no garbage collection.
	h.clock.advance(2 * time.Hour)
	h.srv.CollectGarbage()
	if resp, _ := h.get(imageURL(a)); resp.StatusCode != http.StatusOK {
		t.Errorf("image collected: %d", resp.StatusCode)
	}
	cancel()
	if err := <-watchErr; err != nil {
		t.Errorf("Watch: %v", err)
	}
}

// TestWatchFailsAtStartWithoutGoodInputs: nothing to keep, so Watch
// returns the reason instead of waiting for ever.
func TestWatchFailsAtStartWithoutGoodInputs(t *testing.T) {
	dir := t.TempDir()
	vals := filepath.Join(dir, "values.yaml")
	os.WriteFile(vals, []byte("{}\n"), 0o644)
	for _, tc := range []struct {
		in   serverio.Inputs
		says string
	}{
		{serverio.Inputs{OSImagesFile: filepath.Join(dir, "missing.yaml"), ValueFiles: []string{vals}}, "no such file"},
		{serverio.Inputs{OSImagesFile: vals, ValueFiles: []string{filepath.Join(dir, "missing.yaml")}}, "reading values file"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := tc.in.Watch(ctx, nil, func(serverio.Loaded) error { return nil })
		cancel()
		var r *serverio.RefusedError
		if !errors.As(err, &r) || r.Reason != serverio.RefusalUnreadable || !strings.Contains(err.Error(), tc.says) || !strings.Contains(err.Error(), "no last good ones") {
			t.Errorf("Watch at start: %v, want an unreadable refusal saying %q", err, tc.says)
		}
	}
}

// TestAdmitComparesWithThePublishedSetAtStart: before any set is in force,
// a restart on broken inputs must not empty what the output says is served.
func TestAdmitComparesWithThePublishedSetAtStart(t *testing.T) {
	src := newFakeSource()
	output := filepath.Join(t.TempDir(), "served.yaml")
	cfg := func(allowEmpty bool) Config {
		store := newTestStore(t)
		return Config{Store: store, Pull: src.pull, Publisher: serverio.FilePublisher{Path: output}, AllowEmpty: allowEmpty}
	}
	ctx := context.Background()
	if err := New(cfg(false)).Admit(ctx, nil); err != nil {
		t.Errorf("no output yet: an empty set is fine (a fresh install), got %v", err)
	}
	os.WriteFile(output, []byte("capm3_os_image_server_images:\n  "+hexSum("a")+": {available: true, image_key: a}\n"), 0o644)
	err := New(cfg(false)).Admit(ctx, nil)
	var r *serverio.RefusedError
	if !errors.As(err, &r) || r.Reason != serverio.RefusalEmpty || !strings.Contains(err.Error(), "1 are published at the output") {
		t.Errorf("want an empty refusal naming the published set, got %v", err)
	}
	if err := New(cfg(true)).Admit(ctx, nil); err != nil {
		t.Errorf("--allow-empty: %v", err)
	}
}

// TestAdmitRefusesASetTooLargeForAConfigMap names the size and the count.
func TestAdmitRefusesASetTooLargeForAConfigMap(t *testing.T) {
	srv := New(Config{Store: newTestStore(t), Pull: newFakeSource().pull})
	wanted := map[osimage.SHA256]servedset.Wanted{}
	for i := range 6000 {
		sum := hexSum(fmt.Sprint(i))
		wanted[sum] = servedset.Wanted{SHA256: sum, Key: fmt.Sprintf("image-%05d", i), Desc: osimage.Descriptor{Filename: fmt.Sprintf("image-%05d.raw", i)}}
	}
	err := srv.Admit(context.Background(), wanted)
	var r *serverio.RefusedError
	if !errors.As(err, &r) || r.Reason != serverio.RefusalTooLarge || !strings.Contains(err.Error(), "for 6000 images, over the 1048576 bytes") {
		t.Fatalf("want a too-large refusal naming the count, got %v", err)
	}
	var size *osimage.SizeError
	if !errors.As(err, &size) || size.Bytes <= osimage.MaxConfigMapBytes {
		t.Errorf("size error: %+v", size)
	}
	// Just under the bound passes.
	for len(wanted) > 4000 {
		for k := range wanted {
			delete(wanted, k)
			break
		}
	}
	if err := srv.Admit(context.Background(), wanted); err != nil {
		t.Errorf("4000 images: %v", err)
	}
}

// TestServedOutputDocuments: the served-filenames.yaml key
// beside values.yaml round-trips, and values.yaml keeps exactly the
// contract's two fields.
func TestServedOutputDocuments(t *testing.T) {
	out := osimage.ServedOutput{
		Set:       osimage.ServedSet{hexSum("a"): {Available: true, ImageKey: "a"}},
		Filenames: osimage.ServedFilenames{hexSum("a"): {"a.raw", "b.raw"}},
	}
	data, err := out.ConfigMapData("test")
	if err != nil {
		t.Fatal(err)
	}
	var raw map[string]map[string]map[string]any
	if err := yaml.Unmarshal([]byte(data[osimage.ValuesKey]), &raw); err != nil || len(raw["capm3_os_image_server_images"][hexSum("a").String()]) != 2 {
		t.Errorf("values.yaml: %v %v", raw, err)
	}
	files, err := osimage.ParseServedFilenames([]byte(data[osimage.ServedFilenamesKey]))
	if err != nil {
		t.Fatal(err)
	}
	if served, known := files.Serves(hexSum("a"), "b.raw"); !served || !known {
		t.Errorf("b.raw: %v %v", served, known)
	}
	if served, known := files.Serves(hexSum("a"), "c.raw"); served || !known {
		t.Errorf("c.raw: %v %v", served, known)
	}
	if _, known := files.Serves(hexSum("x"), "c.raw"); known {
		t.Error("an image the document does not list is not known")
	}
}

func hexSum(s string) osimage.SHA256 {
	h := sha256.Sum256([]byte(s))
	return osimage.SHA256(hex.EncodeToString(h[:]))
}
