package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sylva-projects/osimages/internal/devregistry"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/testenv"
)

// serveProcess is an `osimages serve` process.
type serveProcess struct {
	cmd    *exec.Cmd
	addr   string
	stderr *bytes.Buffer
	done   chan struct{}
}

// freeAddr is testenv.FreeAddr.
func freeAddr(t testing.TB) string { return testenv.FreeAddr(t) }

func startServe(t testing.TB, addr string, args ...string) *serveProcess {
	t.Helper()
	d := startDaemon(t, append([]string{"serve", "--listen", addr, "--poll", "100ms", "--free-space-margin", "1Mi"}, args...)...)
	d.addr = addr
	return d
}

func (d *serveProcess) kill(sig syscall.Signal) {
	select {
	case <-d.done:
		return
	default:
	}
	d.cmd.Process.Signal(sig)
	select {
	case <-d.done:
	case <-time.After(15 * time.Second):
		d.cmd.Process.Kill()
		<-d.done
	}
}

func (d *serveProcess) url(path string) string { return "http://" + d.addr + path }

func servedFile(path string) func() osimage.ServedSet {
	return func() osimage.ServedSet {
		data, err := os.ReadFile(path)
		if err != nil {
			return nil
		}
		s, _ := osimage.ParseServed(data)
		return s
	}
}

func allAvailable(served osimage.ServedSet, sums ...osimage.SHA256) bool {
	for _, s := range sums {
		if !served[s].Available {
			return false
		}
	}
	return true
}

// osImagesDocFor writes the os_images entries of published artifacts.
func osImagesDocFor(published map[string]devregistry.Published) string {
	var b strings.Builder
	b.WriteString("os_images:\n")
	for key, p := range published {
		fmt.Fprintf(&b, "  %s:\n    uri: oci://%s\n", key, p.Ref)
		for k, v := range p.Fields {
			fmt.Fprintf(&b, "    %s: %q\n", k, v)
		}
	}
	return b.String()
}

// imageSHA is the sha256 of the image the registry published as p,
// parsed as the image server parses it.
func imageSHA(t testing.TB, p devregistry.Published) osimage.SHA256 {
	t.Helper()
	sha, err := p.Fields.SHA256()
	if err != nil {
		t.Fatalf("%s: %v", p.Ref, err)
	}
	return sha
}

// sha256Of downloads url; code 0 means no answer (not listening yet).
func sha256Of(t *testing.T, url string) (string, int) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		return "", 0
	}
	defer resp.Body.Close()
	h := sha256.New()
	io.Copy(h, resp.Body)
	return hex.EncodeToString(h.Sum(nil)), resp.StatusCode
}

const mgmtServeValues = `name: mgmt
k8s_version: v1.32.5+rke2r1
capi_providers: {infra_provider: capm3, bootstrap_provider: cabpr}
capm3:
  os_image_selector: {os: ubuntu, hardened: "false"}
`

func publishServeImages(t *testing.T, reg *devregistry.Registry, size int) map[string]devregistry.Published {
	t.Helper()
	out := map[string]devregistry.Published{}
	for i, spec := range []struct {
		key, hardened string
		gz            bool
	}{{"ubuntu-plain", "false", true}, {"ubuntu-hardened", "true", false}} {
		p, err := reg.Publish(context.Background(), devregistry.DiskImage{
			Repository: "dib/" + spec.key, Tag: "1.0", Gzip: spec.gz,
			Content: devregistry.DiskContent(size, uint64(i+7)),
			Fields:  osimage.Image{"os": "ubuntu", "hardened": spec.hardened, "k8s-flavor": "rke2", "k8s-version": "1.32.5+rke2r1"},
		})
		if err != nil {
			t.Fatal(err)
		}
		out[spec.key] = p
	}
	return out
}

func TestServeEndToEnd(t *testing.T) {
	reg := testenv.Registry(t, devregistry.Options{})
	published := publishServeImages(t, reg, 3<<20)
	plain, hardened := published["ubuntu-plain"], published["ubuntu-hardened"]
	osImages := writeFile(t, "os-images.yaml", osImagesDocFor(published))
	mgmt := writeFile(t, "mgmt.yaml", mgmtServeValues+"oci_registry_insecure: true\n")
	output := filepath.Join(t.TempDir(), "served.yaml")
	data := t.TempDir()

	d := startServe(t, freeAddr(t), "--data", data, "--os-images", osImages, "-f", mgmt, "--output-file", output)
	served := servedFile(output)
	testenv.Eventually(t, "plain image served", 30*time.Second, func() (bool, string) {
		s := served()
		return allAvailable(s, imageSHA(t, plain)) && len(s) == 1, fmt.Sprint(s, d.stderr.String())
	})
	url := d.url("/images/" + plain.Fields.Get("sha256") + "/" + plain.Fields.Get("filename"))
	if got, code := sha256Of(t, url); code != 200 || got != plain.Fields.Get("sha256") {
		t.Fatalf("GET %s: %d, sha256 %s", url, code, got)
	}
	if resp, err := http.Get(url + ".sha256sum"); err != nil || resp.StatusCode != 200 {
		t.Fatalf("checksum file: %v", err)
	}

	// The values change: the set is recomputed without a restart.
	os.WriteFile(mgmt, []byte(mgmtServeValues+"oci_registry_insecure: true\nos_image_server_additional_selectors:\n  hardened: {hardened: true}\n"), 0o600)
	testenv.Eventually(t, "hardened image served after a values change", 30*time.Second, func() (bool, string) {
		s := served()
		return allAvailable(s, imageSHA(t, plain), imageSHA(t, hardened)), fmt.Sprint(s)
	})
	if got, _ := sha256Of(t, d.url("/images/"+hardened.Fields.Get("sha256")+"/"+hardened.Fields.Get("filename"))); got != hardened.Fields.Get("sha256") {
		t.Errorf("hardened image sha256 %s", got)
	}

	// Deselected: no longer published nor served, but kept on disk.
	os.WriteFile(mgmt, []byte(mgmtServeValues+"oci_registry_insecure: true\n"), 0o600)
	testenv.Eventually(t, "hardened image unpublished", 30*time.Second, func() (bool, string) {
		s := served()
		_, ok := s[imageSHA(t, hardened)]
		return !ok && len(s) == 1, fmt.Sprint(s)
	})
	resp, err := http.Get(d.url("/images/" + hardened.Fields.Get("sha256") + "/" + hardened.Fields.Get("filename")))
	if err != nil || resp.StatusCode != 404 {
		t.Errorf("deselected image: %v %d", err, resp.StatusCode)
	}
	if _, err := os.Stat(filepath.Join(data, "images", hardened.Fields.Get("sha256"))); err != nil {
		t.Errorf("deselected image deleted before the grace period: %v", err)
	}
}

func TestServeSurvivesKillDuringDownload(t *testing.T) {
	// The registry trickles blobs, so that the server is killed mid-download.
	var slow atomic.Bool
	slow.Store(true)
	reg := testenv.Registry(t, devregistry.Options{Middleware: func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if slow.Load() && strings.Contains(r.URL.Path, "/blobs/") && r.Method == http.MethodGet {
				next.ServeHTTP(&trickleWriter{ResponseWriter: w}, r)
				return
			}
			next.ServeHTTP(w, r)
		})
	}})
	published := publishServeImages(t, reg, 4<<20)
	plain := published["ubuntu-plain"]
	osImages := writeFile(t, "os-images.yaml", osImagesDocFor(published))
	mgmt := writeFile(t, "mgmt.yaml", mgmtServeValues+"oci_registry_insecure: true\n")
	output := filepath.Join(t.TempDir(), "served.yaml")
	data := t.TempDir()
	args := []string{"--data", data, "--os-images", osImages, "-f", mgmt, "--output-file", output}

	addr := freeAddr(t)
	d := startServe(t, addr, args...)
	testenv.Eventually(t, "download in progress", 30*time.Second, func() (bool, string) {
		resp, err := http.Get(d.url("/"))
		if err != nil {
			return false, err.Error()
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return downloadingOnPage(string(body)), string(body)
	})
	d.kill(syscall.SIGKILL)

	// Nothing half-downloaded is ever served after the restart.
	slow.Store(false)
	d2 := startServe(t, addr, args...)
	url := d2.url("/images/" + plain.Fields.Get("sha256") + "/" + plain.Fields.Get("filename"))
	testenv.Eventually(t, "image served after a restart", 30*time.Second, func() (bool, string) {
		got, code := sha256Of(t, url)
		if code == 200 && got != plain.Fields.Get("sha256") {
			t.Fatalf("served bytes with sha256 %s, want %s", got, plain.Fields.Get("sha256"))
		}
		return code == 200, fmt.Sprint(code, d2.stderr.String())
	})
}

// trickleWriter sends a response in small, slow writes.
type trickleWriter struct{ http.ResponseWriter }

func (w *trickleWriter) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		c := min(len(p), 32<<10)
		m, err := w.ResponseWriter.Write(p[:c])
		n += m
		if err != nil {
			return n, err
		}
		if f, ok := w.ResponseWriter.(http.Flusher); ok {
			f.Flush()
		}
		time.Sleep(20 * time.Millisecond)
		p = p[c:]
	}
	return n, nil
}

func (w *trickleWriter) ReadFrom(r io.Reader) (int64, error) {
	return io.Copy(struct{ io.Writer }{w}, r)
}

func TestServeWithConfigMaps(t *testing.T) {
	k := apiserver(t)
	ctx := context.Background()
	for _, ns := range []string{"sylva-system"} {
		k.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	}
	reg := testenv.Registry(t, devregistry.Options{})
	published := publishServeImages(t, reg, 1<<20)
	plain, hardened := published["ubuntu-plain"], published["ubuntu-hardened"]
	only := map[string]devregistry.Published{"ubuntu-plain": plain}
	info := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "os-images-info", Namespace: "sylva-system"},
		Data: map[string]string{"values.yaml": osImagesDocFor(only)}}
	if _, err := k.Client.CoreV1().ConfigMaps("sylva-system").Create(ctx, info, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	mgmt := writeFile(t, "mgmt.yaml", mgmtServeValues+"oci_registry_insecure: true\nos_image_server_additional_selectors:\n  hardened: {hardened: true}\n")
	d := startServe(t, freeAddr(t), "--data", t.TempDir(), "--kubeconfig", k.Kubeconfig,
		"--os-images-configmap", "sylva-system/os-images-info", "-f", mgmt,
		"--output-configmap", "sylva-system/capm3-os-image-server-os-images")
	output := func() osimage.ServedSet {
		cm, err := k.Client.CoreV1().ConfigMaps("sylva-system").Get(ctx, "capm3-os-image-server-os-images", metav1.GetOptions{})
		if err != nil {
			return nil
		}
		s, _ := osimage.ParseServed([]byte(cm.Data["values.yaml"]))
		return s
	}
	testenv.Eventually(t, "output ConfigMap", 30*time.Second, func() (bool, string) {
		s := output()
		return allAvailable(s, imageSHA(t, plain)) && len(s) == 1 && s[imageSHA(t, plain)].ImageKey == "ubuntu-plain", fmt.Sprint(s, d.stderr.String())
	})
	// The watched os-images-info gains an image: served without a restart.
	info.Data["values.yaml"] = osImagesDocFor(published)
	if _, err := k.Client.CoreV1().ConfigMaps("sylva-system").Update(ctx, info, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "output after a ConfigMap change", 30*time.Second, func() (bool, string) {
		s := output()
		return allAvailable(s, imageSHA(t, plain), imageSHA(t, hardened)), fmt.Sprint(s)
	})
}

func TestServeInputErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--data", t.TempDir(), "-f", "x.yaml"}, "exactly one of --os-images and --os-images-configmap"},
		{[]string{"--data", t.TempDir(), "-f", "x.yaml", "--os-images", "y", "--max-storage", "lots"}, "--max-storage \"lots\""},
		{[]string{"--data", t.TempDir(), "-f", "x.yaml", "--os-images", "y", "--tls-cert", "c"}, "--tls-cert and --tls-key go together"},
	} {
		r := run(t, append([]string{"serve"}, tc.args...)...)
		if r.code != 2 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%v: exit %d, %q", tc.args, r.code, r.stderr)
		}
	}
}
