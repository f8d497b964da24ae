package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sylva-projects/osimages/internal/devregistry"
	"github.com/sylva-projects/osimages/internal/ocidist"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/testenv"
)

// ociServer is a server of the test images, over plain HTTP or over TLS
// with a certificate of a throw-away CA (caFile).
type ociServer struct {
	name, host, scheme, caFile string
}

func startOCIServers(t *testing.T) (map[string]devregistry.Published, []ociServer) {
	t.Helper()
	reg := testenv.Registry(t, devregistry.Options{})
	published := publishServeImages(t, reg, 3<<20)
	osImages := writeFile(t, "os-images.yaml", osImagesDocFor(published))
	mgmt := writeFile(t, "mgmt.yaml", mgmtServeValues+"oci_registry_insecure: true\n")
	cert, key, ca, err := devregistry.WriteServerCert(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var servers []ociServer
	for _, s := range []struct {
		name string
		tls  []string
	}{{"plain HTTP", nil}, {"TLS", []string{"--tls-cert", cert, "--tls-key", key}}} {
		output := filepath.Join(t.TempDir(), "served.yaml")
		addr := freeAddr(t)
		d := startServe(t, addr, append([]string{"--data", t.TempDir(), "--os-images", osImages, "-f", mgmt, "--output-file", output}, s.tls...)...)
		testenv.Eventually(t, s.name+" server serving the plain image", 60*time.Second, func() (bool, string) {
			return allAvailable(servedFile(output)(), imageSHA(t, published["ubuntu-plain"])), d.stderr.String()
		})
		srv := ociServer{name: s.name, host: addr, scheme: "http"}
		if s.tls != nil {
			srv.scheme, srv.caFile = "https", ca
		}
		servers = append(servers, srv)
	}
	return published, servers
}

// ironicClient runs Ironic's own image services (a current Ironic's code,
// ../shared/ironic, on Debian's python3-ironic libraries) against each of
// urls, in one Python process: OciImageService for oci:// URLs
// (identify_specific_image, show, download) and HttpImageService for
// http(s):// ones (show, the checksum file, download). It returns what
// Ironic reports for each, or skips, saying why, where Ironic's code or its
// libraries are absent.
func ironicClient(t *testing.T, caFile string, urls ...string) []map[string]any {
	t.Helper()
	shared := testenv.SharedDir(t)
	tgz, _ := filepath.Glob(filepath.Join(shared, "ironic", "ironic-*.tgz"))
	if len(tgz) == 0 {
		t.Skip("../shared/ironic holds no Ironic archive: Ironic's clients are not run")
	}
	if err := exec.Command("/usr/bin/python3", "-c", "import oslo_config, requests, oslo_utils").Run(); err != nil {
		t.Skip("Debian's python3-ironic (the libraries Ironic's code needs) is not installed: Ironic's clients are not run; hack/tools.sh installs it where it can")
	}
	dir := t.TempDir()
	if out, err := exec.Command("tar", "-C", dir, "-xzf", tgz[0]).CombinedOutput(); err != nil {
		t.Fatalf("unpacking %s: %v\n%s", tgz[0], err, out)
	}
	script := `
import json, sys
from ironic.conf import CONF
CONF([], project='ironic')
ca, outdir, urls = sys.argv[1], sys.argv[2], sys.argv[3:]
if ca:
    CONF.set_override('webserver_verify_ca', ca)
else:
    CONF.set_override('permit_fallback_to_http_transport', True, group='oci')
from ironic.common import checksum_utils, image_service
results = []
for i, url in enumerate(urls):
    res, out = {}, '%s/%d' % (outdir, i)
    if url.startswith('oci://'):
        s = image_service.OciImageService()
        s.set_image_auth(url, {})
        ident = s.identify_specific_image(url)
        res['identified'] = {k: ident.get(k) for k in ('image_url', 'image_checksum', 'image_size', 'image_disk_format', 'oci_image_manifest_url', 'image_filename')}
        specific = ident.get('oci_image_manifest_url') or url
        res['show'] = s.show(specific)
        with open(out, 'wb') as f:
            s.download(specific, f)
    else:
        s = image_service.HttpImageService()
        res['show'] = {'size': s.show(url)['size']}
        checksum = checksum_utils.get_checksum_from_url(url + '.sha256sum', url)
        with open(out, 'wb') as f:
            s.download(url, f, checksum=checksum, checksum_algo='sha256')
        res['checksum'] = checksum
    res['verified'] = s.transfer_verified_checksum
    results.append(res)
print(json.dumps(results))
`
	outdir := t.TempDir()
	cmd := exec.Command("/usr/bin/python3", append([]string{"-c", script, caFile, outdir}, urls...)...)
	// requests lets REQUESTS_CA_BUNDLE or CURL_CA_BUNDLE override the CA
	// Ironic configures: they go, so that Ironic's own setting decides.
	cmd.Env = []string{"PYTHONPATH=" + dir}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "REQUESTS_CA_BUNDLE=") && !strings.HasPrefix(kv, "CURL_CA_BUNDLE=") && !strings.HasPrefix(kv, "PYTHONPATH=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("Ironic's clients of %v: %v\n%s\n%s", urls, err, stdout.String(), stderr.String())
	}
	var got []map[string]any
	if err := json.Unmarshal(stdout.Bytes(), &got); err != nil || len(got) != len(urls) {
		t.Fatalf("Ironic's clients of %v: %v\n%s", urls, err, stdout.String())
	}
	for i := range got {
		got[i]["file_sha256"] = fileSHA256(t, filepath.Join(outdir, strconv.Itoa(i)))
	}
	return got
}

// Today's Ironic judges both paths: it verifies in transit the checksum it
// takes from the server (the layer digest through oci://, the checksum
// file through HTTP), and it must be the catalog's sha256.
func TestServeIronicTakesBothPaths(t *testing.T) {
	published, servers := startOCIServers(t)
	plain := published["ubuntu-plain"]
	sum := imageSHA(t, plain)
	size, err := plain.Fields.Size(osimage.FieldSize)
	if err != nil {
		t.Fatal(err)
	}
	_, manifest := ocidist.Manifest(sum, size)
	for _, srv := range servers {
		t.Run(srv.name, func(t *testing.T) {
			byDigest := "oci://" + srv.host + "/" + osimage.OCIRepository(sum) + "@" + manifest.String()
			byTag := "oci://" + srv.host + "/" + osimage.OCIRepository(sum) + ":ubuntu-plain"
			httpURL := srv.scheme + "://" + srv.host + osimage.ImagePath(sum, plain.Fields.Get(osimage.FieldFilename))
			got := ironicClient(t, srv.caFile, byDigest, byTag, httpURL)
			wantBlob := srv.scheme + "://" + srv.host + "/v2/" + osimage.OCIRepository(sum) + "/blobs/sha256:" + sum.String()
			for i, url := range []string{byDigest, byTag} {
				show, _ := got[i]["show"].(map[string]any)
				ident, _ := got[i]["identified"].(map[string]any)
				if got[i]["verified"] != "sha256:"+sum.String() || got[i]["file_sha256"] != sum.String() || show["checksum"] != sum.String() ||
					show["size"] != float64(size) || ident["image_checksum"] != sum.String() || ident["image_url"] != wantBlob {
					t.Errorf("Ironic's OciImageService on %s: %v; want the catalog's sha256 %s, size %d, blob %s", url, got[i], sum, size, wantBlob)
				}
				if ident["oci_image_manifest_url"] != byDigest {
					t.Errorf("Ironic resolved %s to %v, want %s", url, ident["oci_image_manifest_url"], byDigest)
				}
			}
			if h := got[2]; h["verified"] != sum.String() && h["verified"] != "sha256:"+sum.String() || h["file_sha256"] != sum.String() || h["checksum"] != sum.String() {
				t.Errorf("Ironic's HttpImageService on %s: %v; want sha256 %s", httpURL, h, sum)
			}
		})
	}
}

// The oras CLI fetches the manifest, the blob and pulls the artifact, over
// plain HTTP and TLS.
func TestServeOrasTakesTheImages(t *testing.T) {
	oras, err := exec.LookPath("oras")
	if err != nil {
		t.Skip("the oras CLI is not on PATH (hack/tools.sh installs it; make test puts it there): skipping the check with oras")
	}
	published, servers := startOCIServers(t)
	// ubuntu-plain is selected; ubuntu-hardened is not, and has no tag.
	plain := published["ubuntu-plain"]
	sum := imageSHA(t, plain)
	size, _ := plain.Fields.Size(osimage.FieldSize)
	wantManifest, manifest := ocidist.Manifest(sum, size)
	run := func(t *testing.T, srv ociServer, args ...string) (string, error) {
		t.Helper()
		if srv.caFile != "" {
			args = append(args, "--ca-file", srv.caFile)
		} else {
			args = append(args, "--plain-http")
		}
		cmd := exec.Command(oras, args...)
		cmd.Env = append(os.Environ(), "DOCKER_CONFIG="+t.TempDir())
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	for _, srv := range servers {
		t.Run(srv.name, func(t *testing.T) {
			repo := srv.host + "/" + osimage.OCIRepository(sum)
			out, err := run(t, srv, "manifest", "fetch", repo+"@"+manifest.String())
			if err != nil || out != string(wantManifest) {
				t.Fatalf("oras manifest fetch: %v\n%s", err, out)
			}
			blob := filepath.Join(t.TempDir(), "blob")
			if out, err := run(t, srv, "blob", "fetch", "--output", blob, repo+"@"+ocidist.LayerDigest(sum).String()); err != nil {
				t.Fatalf("oras blob fetch: %v\n%s", err, out)
			}
			if got := fileSHA256(t, blob); got != sum.String() {
				t.Fatalf("oras blob fetch: sha256 %s, want %s", got, sum)
			}
			dir := t.TempDir()
			if out, err := run(t, srv, "pull", "--output", dir, repo+":ubuntu-plain"); err != nil {
				t.Fatalf("oras pull: %v\n%s", err, out)
			}
			if got := fileSHA256(t, filepath.Join(dir, ocidist.LayerTitle(sum))); got != sum.String() {
				t.Fatalf("oras pull wrote sha256 %s, want %s", got, sum)
			}
			if out, err := run(t, srv, "manifest", "fetch", repo+":ubuntu-hardened"); err == nil || !strings.Contains(out, "not found") {
				t.Errorf("oras manifest fetch of another image's key as a tag must fail as not found: %v\n%s", err, out)
			}
			hardened := srv.host + "/" + osimage.OCIRepository(imageSHA(t, published["ubuntu-hardened"]))
			if out, err := run(t, srv, "manifest", "fetch", hardened+":ubuntu-hardened"); err == nil || !strings.Contains(out, "not found") {
				t.Errorf("oras manifest fetch of an unselected image must fail as not found: %v\n%s", err, out)
			}
		})
	}
}

func fileSHA256(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s := sha256.Sum256(data)
	return hex.EncodeToString(s[:])
}
