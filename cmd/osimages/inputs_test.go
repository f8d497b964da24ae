package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sylva-projects/osimages/internal/devregistry"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/testenv"
)

// The tests of this file are those of inputs that parse but are wrong
// (issue 12): broken edits never empty the served set, look-alike keys are
// refused with a hint, every filename of an image is served, and outputs
// too large for a ConfigMap are refused before they are written.

// replaceFile writes path atomically, so that a poller never reads half of
// it (a half-written file is a case of its own, written on purpose).
func replaceFile(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// get returns the status and body of url, 0 when nothing answers.
func get(url string) (int, string) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// metricOf returns the first sample of the family in a /metrics page whose
// line holds every string of match, or -1.
// waitCollectedAfter waits for a garbage-collection pass of d that began
// after at, so that "nothing was deleted" is a proof and not a hope.
func waitCollectedAfter(t *testing.T, d *serveProcess, at time.Time) {
	t.Helper()
	want := float64(at.UnixNano()) / 1e9
	testenv.Eventually(t, "a garbage-collection pass past the grace period", 30*time.Second, func() (bool, string) {
		_, page := get(d.url("/metrics"))
		last := metricOf(page, "osimages_gc_last_pass_timestamp_seconds")
		return last >= want, fmt.Sprintf("last pass at %.3f, want one after %.3f", last, want)
	})
}

func metricOf(page, name string, match ...string) float64 {
lines:
	for _, line := range strings.Split(page, "\n") {
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		for _, m := range match {
			if !strings.Contains(line, m) {
				continue lines
			}
		}
		if v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64); err == nil {
			return v
		}
	}
	return -1
}

// runFor runs osimages and waits at most timeout for it to exit: a command
// that should exit at once must not hang the suite when it does not.
func runFor(t *testing.T, timeout time.Duration, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.Env = append(os.Environ(), "DOCKER_CONFIG="+t.TempDir())
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("osimages %s still running after %s:\n%s", strings.Join(args, " "), timeout, stderr.String())
	}
	var exitErr *exec.ExitError
	code := 0
	if errors.As(err, &exitErr) {
		code = exitErr.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return result{code: code, stdout: stdout.String(), stderr: stderr.String()}
}

// additionalOnly are management values that select with an additional
// selector only: emptying them, or misspelling the key, loses every image.
const additionalOnly = "oci_registry_insecure: true\nos_image_server_additional_selectors:\n  plain: {os: ubuntu, hardened: \"false\"}\n"

// TestServeServesEveryFilenameOfAnImage is item 2: a second key with the
// same sha256 and another filename, sorting first, is added to the
// management os_images. The first URL keeps answering 200 (it answered 404
// before), the new one answers too, and each checksum file names the file
// asked for.
func TestServeServesEveryFilenameOfAnImage(t *testing.T) {
	reg := testenv.Registry(t, devregistry.Options{})
	published := publishServeImages(t, reg, 1<<20)
	plain := published["ubuntu-plain"]
	only := map[string]devregistry.Published{"ubuntu-plain": plain}
	osImages := writeFile(t, "os-images.yaml", osImagesDocFor(only))
	mgmt := writeFile(t, "mgmt.yaml", mgmtServeValues+"oci_registry_insecure: true\n")
	output := filepath.Join(t.TempDir(), "served.yaml")
	d := startServe(t, freeAddr(t), "--data", t.TempDir(), "--os-images", osImages, "-f", mgmt, "--output-file", output)
	sha, good := plain.Fields.Get("sha256"), plain.Fields.Get("filename")
	url := func(name string) string { return d.url("/images/" + sha + "/" + name) }
	testenv.Eventually(t, "image served", 30*time.Second, func() (bool, string) {
		code, _ := get(url(good))
		return code == 200, fmt.Sprint(code, d.stderr.String())
	})

	renamed := plain.Fields.Clone()
	renamed["filename"] = "renamed.raw"
	replaceFile(t, osImages, osImagesDocFor(only)+osImagesDocFor(map[string]devregistry.Published{
		"a-renamed": {Ref: plain.Ref, Fields: renamed},
	})[len("os_images:\n"):])
	testenv.Eventually(t, "the second filename served", 30*time.Second, func() (bool, string) {
		code, _ := get(url("renamed.raw"))
		return code == 200, fmt.Sprint(code, d.stderr.String())
	})
	for _, name := range []string{good, "renamed.raw"} {
		if got, code := sha256Of(t, url(name)); code != 200 || got != sha {
			t.Errorf("GET %s: %d, sha256 %s", name, code, got)
		}
		if code, body := get(url(name + ".sha256sum")); code != 200 || body != sha+"  "+name+"\n" {
			t.Errorf("GET %s.sha256sum: %d %q", name, code, body)
		}
	}
	if code, _ := get(url("other.raw")); code != 404 {
		t.Errorf("a filename no key gives: %d, want 404", code)
	}
	if s := servedFile(output)(); len(s) != 1 || !s[imageSHA(t, plain)].Available {
		t.Errorf("one image, published once: %v", s)
	}
}

// TestServeRefusesBrokenInputs is item 3 with files: each broken edit is
// refused, said in the log, on the status page and in a metric, and
// changes nothing served or published, even past --gc-grace; good inputs
// are taken again.
func TestServeRefusesBrokenInputs(t *testing.T) {
	reg := testenv.Registry(t, devregistry.Options{})
	published := publishServeImages(t, reg, 1<<20)
	plain := published["ubuntu-plain"]
	goodImages := osImagesDocFor(published)
	osImages := writeFile(t, "os-images.yaml", goodImages)
	mgmt := writeFile(t, "mgmt.yaml", additionalOnly)
	output := filepath.Join(t.TempDir(), "served.yaml")
	data := t.TempDir()
	d := startServe(t, freeAddr(t), "--data", data, "--os-images", osImages, "-f", mgmt, "--output-file", output, "--gc-grace", "1s")
	sha := plain.Fields.Get("sha256")
	imageURL := d.url("/images/" + sha + "/" + plain.Fields.Get("filename"))
	testenv.Eventually(t, "image served", 30*time.Second, func() (bool, string) {
		s := servedFile(output)()
		return allAvailable(s, imageSHA(t, plain)) && len(s) == 1, fmt.Sprint(s, d.stderr.String())
	})
	goodOutput, err := os.ReadFile(output)
	if err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name, osImages, values, reason, says string
	}{
		{"emptied os_images file", "", additionalOnly, "empty", "the inputs select no image, while 1 are served"},
		{"half-written os_images file", goodImages[:strings.Index(goodImages, "\n")+1], additionalOnly, "empty", "--allow-empty"},
		{"os_image: typed for os_images:", strings.Replace(goodImages, "os_images:", "os_image:", 1), additionalOnly, "near-miss", "os_image: did you mean os_images?"},
		{"emptied values file", goodImages, "", "empty", "select no image"},
		{"misspelt additional selectors", goodImages, strings.Replace(additionalOnly, "selectors", "selector", 1), "near-miss", "os_image_server_additional_selector: did you mean os_image_server_additional_selectors?"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			replaceFile(t, osImages, tc.osImages)
			replaceFile(t, mgmt, tc.values)
			refused := `osimages_inputs_refused{reason="` + tc.reason + `"} 1`
			testenv.Eventually(t, "the refusal in the metrics", 30*time.Second, func() (bool, string) {
				_, page := get(d.url("/metrics"))
				return metricOf(page, "osimages_inputs_refused", `reason="`+tc.reason+`"`) == 1, refused + "\n" + grepLines(page, "osimages_inputs")
			})
			if _, page := get(d.url("/")); !strings.Contains(page, `id="inputs-refused"`) || !strings.Contains(page, tc.says) {
				t.Errorf("the status page does not say the inputs are refused (%q):\n%s", tc.says, page)
			}
			if log := d.stderr.String(); !strings.Contains(log, "inputs refused; the last good ones stay in force") || !strings.Contains(log, tc.says) {
				t.Errorf("the log does not say so:\n%s", grepLines(log, "refused"))
			}
			// Past --gc-grace: still served, published and stored.
			waitCollectedAfter(t, d, time.Now().Add(time.Second))
			if got, code := sha256Of(t, imageURL); code != 200 || got != sha {
				t.Errorf("image answers %d", code)
			}
			if now, _ := os.ReadFile(output); !bytes.Equal(now, goodOutput) {
				t.Errorf("the output changed:\n%s", now)
			}
			if _, err := os.Stat(filepath.Join(data, "images", sha)); err != nil {
				t.Errorf("the image file is gone: %v", err)
			}

			replaceFile(t, osImages, goodImages)
			replaceFile(t, mgmt, additionalOnly)
			testenv.Eventually(t, "good inputs in force again", 30*time.Second, func() (bool, string) {
				_, page := get(d.url("/metrics"))
				return metricOf(page, "osimages_inputs_refused", `reason="`+tc.reason+`"`) == 0, grepLines(page, "osimages_inputs")
			})
		})
	}
	_, page := get(d.url("/metrics"))
	if n := metricOf(page, "osimages_inputs_refusals_total", `reason="empty"`); n != 3 {
		t.Errorf("each refusal counts once, not at every poll: %v empty refusals\n%s", n, grepLines(page, "osimages_inputs"))
	}
}

// TestServeRefusesBrokenConfigMapInputs is item 10: os-images-info set to
// "", os_images: {}, os_imagez: {} or os_images: (null) empties neither the
// served set nor its ConfigMap (so nothing propagates), and no file is
// collected.
func TestServeRefusesBrokenConfigMapInputs(t *testing.T) {
	k := apiserver(t)
	ctx := context.Background()
	const ns = "inputs-cm"
	if _, err := k.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	reg := testenv.Registry(t, devregistry.Options{})
	published := publishServeImages(t, reg, 1<<20)
	plain := published["ubuntu-plain"]
	sha := plain.Fields.Get("sha256")
	good := osImagesDocFor(published)
	info := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "os-images-info", Namespace: ns}, Data: map[string]string{"values.yaml": good}}
	if _, err := k.Client.CoreV1().ConfigMaps(ns).Create(ctx, info, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	mgmt := writeFile(t, "mgmt.yaml", additionalOnly)
	data := t.TempDir()
	d := startServe(t, freeAddr(t), "--data", data, "--kubeconfig", k.Kubeconfig, "--gc-grace", "1s",
		"--os-images-configmap", ns+"/os-images-info", "-f", mgmt, "--output-configmap", ns+"/served")
	outputCM := func() *corev1.ConfigMap {
		cm, err := k.Client.CoreV1().ConfigMaps(ns).Get(ctx, "served", metav1.GetOptions{})
		if err != nil {
			return &corev1.ConfigMap{}
		}
		return cm
	}
	testenv.Eventually(t, "output ConfigMap", 30*time.Second, func() (bool, string) {
		s, _ := osimage.ParseServed([]byte(outputCM().Data["values.yaml"]))
		return allAvailable(s, imageSHA(t, plain)) && len(s) == 1, fmt.Sprint(s, d.stderr.String())
	})
	before := outputCM()
	if files := before.Data["served-filenames.yaml"]; !strings.Contains(files, sha+":\n  - "+plain.Fields.Get("filename")+"\n") {
		t.Errorf("the output lacks served-filenames.yaml naming the image's filename:\n%v", before.Data)
	}

	for _, tc := range []struct{ doc, reason string }{
		{"", "empty"}, {"os_images: {}\n", "empty"}, {"os_imagez: {}\n", "near-miss"}, {"os_images:\n", "empty"},
	} {
		t.Run(fmt.Sprintf("%q", tc.doc), func(t *testing.T) {
			info.Data["values.yaml"] = tc.doc
			if _, err := k.Client.CoreV1().ConfigMaps(ns).Update(ctx, info, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			testenv.Eventually(t, "the refusal in the metrics", 30*time.Second, func() (bool, string) {
				_, page := get(d.url("/metrics"))
				return metricOf(page, "osimages_inputs_refused", `reason="`+tc.reason+`"`) == 1, grepLines(page, "osimages_inputs") + d.stderr.String()
			})
			waitCollectedAfter(t, d, time.Now().Add(time.Second)) // past --gc-grace
			if after := outputCM(); after.ResourceVersion != before.ResourceVersion {
				t.Errorf("the output ConfigMap was written: %v", after.Data)
			}
			if code, _ := get(d.url("/images/" + sha + "/" + plain.Fields.Get("filename"))); code != 200 {
				t.Errorf("image answers %d", code)
			}
			if _, err := os.Stat(filepath.Join(data, "images", sha)); err != nil {
				t.Errorf("the image file is gone: %v", err)
			}
			info.Data["values.yaml"] = good
			if _, err := k.Client.CoreV1().ConfigMaps(ns).Update(ctx, info, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			testenv.Eventually(t, "good inputs in force again", 30*time.Second, func() (bool, string) {
				_, page := get(d.url("/metrics"))
				return metricOf(page, "osimages_inputs_refused", `reason="`+tc.reason+`"`) == 0, grepLines(page, "osimages_inputs")
			})
		})
	}
}

// TestServeWaitsForTheOSImagesConfigMap: a watched os-images-info that does
// not exist yet (the catalog is about to create it) is waited for, as a
// phase and not a refusal, instead of an exit: it is no broken input.
func TestServeWaitsForTheOSImagesConfigMap(t *testing.T) {
	k := apiserver(t)
	ctx := context.Background()
	const ns = "inputs-wait"
	if _, err := k.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	osImages := writeFile(t, "os-images.yaml", "os_images:\n  unreachable: {uri: 'http://127.0.0.1:1/x.raw', sha256: '"+sum("x")+"', filename: x.raw, image-format: raw, os: ubuntu, hardened: 'false'}\n")
	doc, _ := os.ReadFile(osImages)
	d := startServe(t, freeAddr(t), "--data", t.TempDir(), "--kubeconfig", k.Kubeconfig, "-f", writeFile(t, "mgmt.yaml", additionalOnly),
		"--os-images-configmap", ns+"/os-images-info", "--output-configmap", ns+"/served")
	testenv.Eventually(t, "waiting for the catalog, and saying why", 30*time.Second, func() (bool, string) {
		_, page := get(d.url("/metrics"))
		return metricOf(page, "osimages_server_phase", `phase="waiting-for-catalog"`) == 1 &&
			metricOf(page, "osimages_inputs_refused", `reason="unreadable"`) == 0, fmt.Sprint(grepLines(page, "osimages_"), d.stderr.String())
	})
	if _, page := get(d.url("/")); !strings.Contains(page, "ConfigMap "+ns+"/os-images-info does not exist yet") {
		t.Errorf("the status page does not say what is missing:\n%s", page)
	}
	if strings.Contains(d.stderr.String(), `"level":"ERROR"`) {
		t.Errorf("waiting for the catalog is logged as an error:\n%s", d.stderr.String())
	}
	info := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "os-images-info", Namespace: ns}, Data: map[string]string{"values.yaml": string(doc)}}
	if _, err := k.Client.CoreV1().ConfigMaps(ns).Create(ctx, info, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "ready and published once it exists", 30*time.Second, func() (bool, string) {
		code, _ := get(d.url("/readyz"))
		cm, err := k.Client.CoreV1().ConfigMaps(ns).Get(ctx, "served", metav1.GetOptions{})
		return code == 200 && err == nil && strings.Contains(cm.Data["values.yaml"], sum("x")), fmt.Sprint(code, err, d.stderr.String())
	})
}

// TestServeExitsOnUnusableInputsAtStart: with no last good inputs to keep,
// serve exits 2 with the reason (it used to run for ever, serving nothing).
// Emptying the published set on purpose takes --allow-empty.
func TestServeExitsOnUnusableInputsAtStart(t *testing.T) {
	mgmt := writeFile(t, "mgmt.yaml", additionalOnly)
	output := filepath.Join(t.TempDir(), "served.yaml")
	var huge strings.Builder
	huge.WriteString("os_images:\n")
	for i := range 6000 {
		fmt.Fprintf(&huge, "  image-%05d: {uri: 'http://127.0.0.1:1/image-%05d.raw', sha256: '%s', filename: image-%05d.raw, image-format: raw, os: ubuntu, hardened: 'false'}\n", i, i, sum(fmt.Sprint(i)), i)
	}
	for _, tc := range []struct {
		name, osImages string
		says           []string
	}{
		{"missing os_images file", filepath.Join(t.TempDir(), "nope.yaml"), []string{"no such file"}},
		{"near-miss", writeFile(t, "near.yaml", "os_image: {}\n"), []string{"os_image: did you mean os_images?"}},
		{"too large for a ConfigMap", writeFile(t, "huge.yaml", huge.String()), []string{"the served set would hold", "for 6000 images, over the 1048576 bytes (1 MiB) a ConfigMap can hold"}},
	} {
		r := runFor(t, 60*time.Second, "serve", "--listen", "127.0.0.1:0", "--data", t.TempDir(), "--os-images", tc.osImages, "-f", mgmt, "--output-file", output)
		if r.code != 2 || !strings.Contains(r.stderr, "no last good ones to keep") {
			t.Errorf("%s: exit %d, want 2:\n%s", tc.name, r.code, r.stderr)
		}
		for _, s := range tc.says {
			if !strings.Contains(r.stderr, s) {
				t.Errorf("%s: stderr lacks %q:\n%s", tc.name, s, r.stderr)
			}
		}
	}

	// A restart on inputs that select nothing, while the output publishes
	// an image: refused too. With --allow-empty, the set is emptied.
	os.WriteFile(output, []byte("capm3_os_image_server_images:\n  "+sum("x")+": {available: true, image_key: x}\n"), 0o644)
	empty := writeFile(t, "empty.yaml", "os_images: {}\n")
	r := runFor(t, 60*time.Second, "serve", "--listen", "127.0.0.1:0", "--data", t.TempDir(), "--os-images", empty, "-f", mgmt, "--output-file", output)
	if r.code != 2 || !strings.Contains(r.stderr, "the inputs select no image, while 1 are published at the output") {
		t.Errorf("restart on empty inputs: exit %d:\n%s", r.code, r.stderr)
	}
	d := startServe(t, freeAddr(t), "--data", t.TempDir(), "--os-images", empty, "-f", mgmt, "--output-file", output, "--allow-empty")
	testenv.Eventually(t, "emptied on purpose", 30*time.Second, func() (bool, string) {
		s := servedFile(output)()
		return s != nil && len(s) == 0, fmt.Sprint(s, d.stderr.String())
	})
}

// TestServeOutputFileIsWorldReadable: the served-set file is a values file
// naming images, read by other users and tools (it was 0600).
func TestServeOutputFileIsWorldReadable(t *testing.T) {
	osImages := writeFile(t, "os-images.yaml", "os_images:\n  unreachable: {uri: 'http://127.0.0.1:1/x.raw', sha256: '"+sum("x")+"', filename: x.raw, image-format: raw, os: ubuntu, hardened: 'false'}\n")
	mgmt := writeFile(t, "mgmt.yaml", additionalOnly)
	output := filepath.Join(t.TempDir(), "served.yaml")
	d := startServe(t, freeAddr(t), "--data", t.TempDir(), "--os-images", osImages, "-f", mgmt, "--output-file", output)
	testenv.Eventually(t, "output written", 30*time.Second, func() (bool, string) {
		_, err := os.Stat(output)
		return err == nil, d.stderr.String()
	})
	fi, err := os.Stat(output)
	if err != nil {
		t.Fatal(err)
	}
	if mode := fi.Mode().Perm(); mode != 0o644 {
		t.Errorf("--output-file mode %o, want 644", mode)
	}
	d.kill(syscall.SIGTERM)
}

// TestCatalogNearMissIsAnInputError: values whose only relevant keys are
// misspelt printed os_images: {} with exit 0 (and --apply would have wiped
// os-images-info); now exit 2 with a hint, nothing printed.
func TestCatalogNearMissIsAnInputError(t *testing.T) {
	for _, tc := range []struct{ doc, says string }{
		{"os_image:\n  mine: {uri: 'https://files.example.org/mine.raw', sha256: '" + sum("m") + "', image-format: raw}\n", "os_image: did you mean os_images?"},
		{"os_images_oci_registry:\n  sylva: {url: 'oci://127.0.0.1:1/dib', tag: '1.0'}\nsylva_diskimagebuilder_images:\n  ubuntu: {os_images_oci_registry: sylva}\n", "os_images_oci_registry: did you mean os_images_oci_registries?"},
		{"os_images_oci_registries:\n  sylva: {url: 'oci://127.0.0.1:1/dib', tag: '1.0', cosign_public_key: 'k'}\nsylva_diskimagebuilder_images:\n  ubuntu: {os_images_oci_registry: sylva}\n", "os_images_oci_registries.sylva.cosign_public_key: did you mean cosign_publickey?"},
	} {
		r := run(t, "catalog", "-f", writeFile(t, "values.yaml", tc.doc))
		if r.code != 2 || !strings.Contains(r.stderr, tc.says) || r.stdout != "" {
			t.Errorf("%q: exit %d, stdout %q, stderr %s", tc.doc, r.code, r.stdout, r.stderr)
		}
	}
}

// TestCatalogApplyRefusesEmptying: replacing an os-images-info that lists
// images with an empty one takes --allow-empty.
func TestCatalogApplyRefusesEmptying(t *testing.T) {
	k := apiserver(t)
	const ns = "catalog-emptying"
	if _, err := k.Client.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	images := writeFile(t, "values.yaml", "os_images:\n  mine: {uri: 'https://files.example.org/mine.raw', sha256: '"+sum("m")+"', image-format: raw}\n")
	apply := func(values string, extra ...string) result {
		return run(t, append([]string{"catalog", "-f", values, "--apply", "--kubeconfig", k.Kubeconfig, "-n", ns}, extra...)...)
	}
	catalogIn := func() osimage.Catalog {
		cm, err := k.Client.CoreV1().ConfigMaps(ns).Get(context.Background(), "os-images-info", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cat, err := osimage.ParseInfo([]byte(cm.Data["values.yaml"]))
		if err != nil {
			t.Fatal(err)
		}
		return cat
	}
	if r := apply(images); r.code != 0 || len(catalogIn()) != 1 {
		t.Fatalf("apply: %d %s", r.code, r.stderr)
	}
	emptied := writeFile(t, "emptied.yaml", "units: {}\n")
	r := apply(emptied)
	if r.code != 2 || !strings.Contains(r.stderr, "ConfigMap "+ns+"/os-images-info lists 1 images: not replaced") || !strings.Contains(r.stderr, "--allow-empty") {
		t.Errorf("emptying apply: exit %d: %s", r.code, r.stderr)
	}
	if len(catalogIn()) != 1 {
		t.Error("os-images-info emptied")
	}
	if r := apply(emptied, "--allow-empty"); r.code != 0 || len(catalogIn()) != 0 {
		t.Errorf("--allow-empty: exit %d, %v: %s", r.code, catalogIn(), r.stderr)
	}
}

// TestCatalogRefusesTooLargeCatalog is item 13 for the catalog: some 1,600
// images pass the 1 MiB a ConfigMap holds; the error names the size and
// the count, and nothing is printed.
func TestCatalogRefusesTooLargeCatalog(t *testing.T) {
	var b strings.Builder
	b.WriteString("os_images:\n")
	for i := range 1700 {
		// 650 bytes an image, as a real catalog's records weigh.
		fmt.Fprintf(&b, "  image-%04d: {uri: 'https://files.example.org/image-%04d.raw', sha256: '%s', image-format: raw, description: %s}\n", i, i, sum(fmt.Sprint(i)), strings.Repeat("x", 470))
	}
	r := run(t, "catalog", "-f", writeFile(t, "values.yaml", b.String()))
	if r.code != 2 || r.stdout != "" || !strings.Contains(r.stderr, "ConfigMap sylva-system/os-images-info would hold") || !strings.Contains(r.stderr, "for 1700 images, over the 1048576 bytes (1 MiB) a ConfigMap can hold") {
		t.Errorf("exit %d, stdout %d bytes, stderr %s", r.code, len(r.stdout), r.stderr)
	}
}

// TestPlanReportsUnservedFilename: the proposed management catalog serves
// the sha256 the cluster picks, but under another filename than the
// cluster's own catalog gives it: the URL render writes would answer 404.
func TestPlanReportsUnservedFilename(t *testing.T) {
	mgmt := writeFile(t, "mgmt.yaml", `name: mgmt
k8s_version: v1.32.5+rke2r1
capi_providers: {infra_provider: capm3, bootstrap_provider: cabpr}
capm3: {os_image_selector: {os: ubuntu, hardened: "false"}}
`)
	osImages := writeFile(t, "os-images.yaml", osImagesDoc)
	current := writeFile(t, "served.yaml", servedDoc(true, sum("plain")))
	own := strings.Replace(osImagesDoc, "filename: ubuntu-plain.raw", "filename: renamed-by-the-cluster.raw", 1)
	wc := writeFile(t, "wc.yaml", clusterDoc+"machine_deployments: null\n"+own)
	r := run(t, "plan", "-f", mgmt, "--os-images", osImages, "--served", current, "--cluster", "wc1="+wc)
	if r.code != 1 || !strings.Contains(r.stdout, "would fail: "+sum("plain")+"/ubuntu-plain not served under the filename renamed-by-the-cluster.raw") {
		t.Errorf("want exit 1 naming the filename, got %d:\n%s\n%s", r.code, r.stdout, r.stderr)
	}
}
