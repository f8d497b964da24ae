package testenv

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// IronicResult is what Ironic's own image service reported for one URL.
type IronicResult struct {
	// Show is what show() returned: size, and for oci:// the checksum
	// (the layer digest's hex), digest and image_type.
	Show map[string]any `json:"show"`
	// Identified is what OciImageService.identify_specific_image returned
	// (image_url, image_checksum, oci_image_manifest_url, ...).
	Identified map[string]any `json:"identified"`
	// Checksum is, for an http(s) URL, the sha256 its checksum file gave.
	Checksum string `json:"checksum"`
	// Verified is transfer_verified_checksum: what Ironic verified in
	// transit ("sha256:<hex>" for oci://).
	Verified string `json:"verified"`
	// InstanceInfo is, for an oci:// URL, the instance_info the
	// conductor's deploy_utils.build_instance_info_for_deploy builds for a
	// whole-disk image whose Metal3 format is raw (image_disk_format,
	// image_url, image_checksum, image_source, oci_image_manifest_url):
	// its image_disk_format is the disk_format IPA receives.
	InstanceInfo map[string]any `json:"instance_info"`
	// FileSHA256 is the sha256 of the file Ironic wrote.
	FileSHA256 string `json:"-"`
}

// Size is the size show() gave.
func (r IronicResult) Size() int64 {
	f, _ := r.Show["size"].(float64)
	return int64(f)
}

// ironicScript drives Ironic's image services as its conductor does:
// OciImageService (identify_specific_image, then show and download of the
// specific manifest) for oci:// URLs, HttpImageService (show, the checksum
// file, download checked in transit) for http(s):// ones. For an oci://
// URL it also runs the conductor's own build_instance_info_for_deploy on
// a node as BareMetalOperator sets it (image_source the URL,
// image_disk_format raw, a whole-disk image, no memory_mb so no RAM check),
// as the deploy does before it tells IPA the disk_format.
//
// deploy_utils imports ironic.common.images, which imports
// oslo_utils.imageutils.format_inspector, newer than Debian 12's oslo.utils;
// only the image cache and content inspection use it, which a remote
// oci:// or http(s) image with the default configuration
// (conductor_always_validates_images off, image_download_source http)
// never reaches. The script puts an empty module in its place (and fails
// loudly, not silently, if the path ever reaches it).
const ironicScript = `
import json, sys, types
import oslo_utils.imageutils as _iu
try:
    from oslo_utils.imageutils import format_inspector as _fi
except ImportError:
    _fi = types.ModuleType('oslo_utils.imageutils.format_inspector')
    sys.modules[_fi.__name__] = _fi
    _iu.format_inspector = _fi
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
        from ironic.drivers.modules import deploy_utils
        node = types.SimpleNamespace(uuid='00000000-0000-0000-0000-000000000000',
            instance_info={'image_source': url, 'image_disk_format': 'raw'},
            driver_internal_info={'is_whole_disk_image': True}, driver_info={}, properties={})
        ii = deploy_utils.build_instance_info_for_deploy(types.SimpleNamespace(node=node))
        res['instance_info'] = {k: ii.get(k) for k in ('image_disk_format', 'image_url', 'image_checksum', 'image_source', 'oci_image_manifest_url')}
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

// notRun returns why, after failing the test through Missing where
// RequireAllEnv is set.
func notRun(t testing.TB, why string) string {
	t.Helper()
	if Required() {
		Missing(t, "%s", why)
	}
	return why
}

// Ironic runs a current Ironic's own image services (its code from the
// shared fixtures, shared/ironic, on Debian's python3-ironic libraries)
// against each of urls, in one Python process, trusting caFile for https
// ("" for plain HTTP, which Ironic reaches after trying HTTPS first). It
// returns what Ironic reported for each, or, when Ironic's code or its
// libraries are absent here, why it was not run ("" when it ran); the
// caller ends the test through Missing or logs that. Where RequireAllEnv is
// set, their absence fails the test here, as does a failure of Ironic.
func Ironic(t testing.TB, caFile string, urls ...string) ([]IronicResult, string) {
	t.Helper()
	shared := os.Getenv("OSIMAGES_SHARED_DIR")
	if shared == "" {
		shared = findSharedDir()
	}
	if shared == "" {
		return nil, notRun(t, "shared/ fixtures not found beside the checkout (set OSIMAGES_SHARED_DIR): Ironic's clients are not run")
	}
	tgz, _ := filepath.Glob(filepath.Join(shared, "ironic", "ironic-*.tgz"))
	if len(tgz) == 0 {
		return nil, notRun(t, "shared/ironic holds no Ironic archive: Ironic's clients are not run")
	}
	// Debian's python3, which python3-ironic's libraries are for (a
	// python3 of pyenv first on PATH lacks them).
	python := "/usr/bin/python3"
	if err := exec.Command(python, "-c", "import oslo_config, oslo_utils, requests").Run(); err != nil {
		return nil, notRun(t, "Debian's python3-ironic (the libraries of Ironic's code) is not installed: Ironic's clients are not run; hack/tools.sh installs it where it can")
	}
	dir := t.TempDir()
	if out, err := exec.Command("tar", "-C", dir, "-xzf", tgz[0]).CombinedOutput(); err != nil {
		t.Fatalf("unpacking %s: %v\n%s", tgz[0], err, out)
	}
	outdir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, python, append([]string{"-c", ironicScript, caFile, outdir}, urls...)...)
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
	var got []IronicResult
	if err := json.Unmarshal(stdout.Bytes(), &got); err != nil || len(got) != len(urls) {
		t.Fatalf("Ironic's clients of %v: %v\n%s", urls, err, stdout.String())
	}
	for i := range got {
		f, err := os.Open(filepath.Join(outdir, strconv.Itoa(i)))
		if err != nil {
			t.Fatal(err)
		}
		h := sha256.New()
		_, err = io.Copy(h, f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		got[i].FileSHA256 = hex.EncodeToString(h.Sum(nil))
	}
	return got, ""
}

// CheckIronicHTTP checks what Ironic's HttpImageService reported of an
// image URL: the size, the checksum file's sha256, the checksum verified
// in transit and the file written, all the image's.
func CheckIronicHTTP(r IronicResult, sha256 string, size int64) error {
	if r.Size() != size || r.Checksum != sha256 || (r.Verified != sha256 && r.Verified != "sha256:"+sha256) || r.FileSHA256 != sha256 {
		return fmt.Errorf("Ironic's HttpImageService: size %d, checksum file %s, verified in transit %q, file sha256 %s; want size %d and sha256 %s",
			r.Size(), r.Checksum, r.Verified, r.FileSHA256, size, sha256)
	}
	return nil
}
