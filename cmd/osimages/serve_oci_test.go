package main

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sylva-projects/osimages/internal/devregistry"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/testenv"
)

// ociServer is a server of the test images, over plain HTTP or over TLS
// with a certificate of a throw-away CA (caFile).
type ociServer struct {
	name, host, scheme, caFile string
	// output is the file of the served set it publishes.
	output string
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
		// File mode publishes the OCI references too, beside the values
		// file (issue 35): the one the ConfigMap holds as served-oci.yaml.
		sum := imageSHA(t, published["ubuntu-plain"])
		size, _ := published["ubuntu-plain"].Fields.Size(osimage.FieldSize)
		_, manifest := osimage.OCIManifest(sum, size)
		testenv.Eventually(t, s.name+" server's served-oci.yaml beside "+output, 30*time.Second, func() (bool, string) {
			doc, err := os.ReadFile(filepath.Join(filepath.Dir(output), "served-oci.yaml"))
			if err != nil {
				return false, err.Error()
			}
			refs, err := osimage.ParseServedOCI(doc)
			want := osimage.OCIServed{Repository: osimage.OCIRepository(sum), Manifest: manifest}
			return err == nil && refs[sum] == want, fmt.Sprintf("%s (%v), want %+v", doc, err, want)
		})
		srv := ociServer{name: s.name, host: addr, scheme: "http", output: output}
		if s.tls != nil {
			srv.scheme, srv.caFile = "https", ca
		}
		servers = append(servers, srv)
	}
	return published, servers
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
	_, manifest := osimage.OCIManifest(sum, size)
	for _, srv := range servers {
		t.Run(srv.name, func(t *testing.T) {
			byDigest := "oci://" + srv.host + "/" + osimage.OCIRepository(sum) + "@" + manifest.String()
			byTag := "oci://" + srv.host + "/" + osimage.OCIRepository(sum) + ":ubuntu-plain"
			httpURL := srv.scheme + "://" + srv.host + osimage.ImagePath(sum, plain.Fields.Get(osimage.FieldFilename))
			got, why := testenv.Ironic(t, srv.caFile, byDigest, byTag, httpURL)
			if why != "" {
				testenv.Missing(t, "%s", why)
			}
			wantBlob := srv.scheme + "://" + srv.host + "/v2/" + osimage.OCIRepository(sum) + "/blobs/sha256:" + sum.String()
			for i, url := range []string{byDigest, byTag} {
				r := got[i]
				if r.Verified != "sha256:"+sum.String() || r.FileSHA256 != sum.String() || r.Show["checksum"] != sum.String() ||
					r.Size() != size || r.Identified["image_checksum"] != sum.String() || r.Identified["image_url"] != wantBlob {
					t.Errorf("Ironic's OciImageService on %s: %+v; want the catalog's sha256 %s, size %d, blob %s", url, r, sum, size, wantBlob)
				}
				if r.Identified["oci_image_manifest_url"] != byDigest {
					t.Errorf("Ironic resolved %s to %v, want %s", url, r.Identified["oci_image_manifest_url"], byDigest)
				}
			}
			if err := testenv.CheckIronicHTTP(got[2], sum.String(), size); err != nil {
				t.Errorf("%s: %v", httpURL, err)
			}
		})
	}
}

// TestServeIronicDeploysRendersOCIURLAsRaw: the oci:// URL render writes
// (image_delivery: oci, from the cluster's own catalog, checked against
// the served set the server publishes) is identified as raw by Ironic's
// own OciImageService.identify_specific_image, and the instance_info its
// conductor's build_instance_info_for_deploy builds from it keeps
// image_disk_format: raw, the disk_format IPA streams onto the disk. The
// URL render wrote before, pinned to the manifest digest, is "unknown" to
// Ironic, which then drops Metal3's raw: IPA got disk_format null and
// copied the whole image into its RAM.
func TestServeIronicDeploysRendersOCIURLAsRaw(t *testing.T) {
	published, servers := startOCIServers(t)
	plain := published["ubuntu-plain"]
	sum := imageSHA(t, plain)
	size, err := plain.Fields.Size(osimage.FieldSize)
	if err != nil {
		t.Fatal(err)
	}
	srv := servers[0] // plain HTTP; TLS changes nothing of the disk format
	cluster := writeFile(t, "cluster.yaml", mgmtServeValues+"  image_provisioning_host: "+srv.host+"\n  image_delivery: oci\n")
	r := run(t, "render", "-f", cluster, "-f", writeFile(t, "os-images.yaml", osImagesDocFor(published)), "-f", srv.output)
	want := osimage.OCIReference{Host: srv.host, SHA256: sum, DiskType: "raw"}.String()
	if r.code != 0 || !strings.Contains(r.stdout, "url: "+want+"\n") {
		t.Fatalf("render with image_delivery: oci: exit %d, want url %s in\n%s%s", r.code, want, r.stdout, r.stderr)
	}
	_, manifest := osimage.OCIManifest(sum, size)
	byDigest := "oci://" + srv.host + "/" + osimage.OCIRepository(sum) + "@" + manifest.String()
	got, why := testenv.Ironic(t, "", want, byDigest)
	if why != "" {
		testenv.Missing(t, "%s", why)
	}
	rendered, pinned := got[0], got[1]
	if rendered.Identified["image_disk_format"] != "raw" || rendered.InstanceInfo["image_disk_format"] != "raw" {
		t.Errorf("Ironic on render's URL %s: identified disk format %v, instance_info image_disk_format %v; want raw and raw\n%+v",
			want, rendered.Identified["image_disk_format"], rendered.InstanceInfo["image_disk_format"], rendered)
	}
	wantBlob := "http://" + srv.host + "/v2/" + osimage.OCIRepository(sum) + "/blobs/sha256:" + sum.String()
	if rendered.Verified != "sha256:"+sum.String() || rendered.FileSHA256 != sum.String() || rendered.Identified["image_checksum"] != sum.String() ||
		rendered.InstanceInfo["image_url"] != wantBlob || rendered.InstanceInfo["oci_image_manifest_url"] != byDigest || rendered.InstanceInfo["image_checksum"] != sum.String() {
		t.Errorf("Ironic on render's URL %s: %+v; want the blob %s of sha256 %s through the manifest %s", want, rendered, wantBlob, sum, byDigest)
	}
	// The form render wrote before: what the issue saw.
	if pinned.Identified["image_disk_format"] != "unknown" || pinned.InstanceInfo["image_disk_format"] != nil {
		t.Errorf("Ironic on the digest-pinned URL %s: identified %v, instance_info image_disk_format %v; want unknown, then none (Ironic's own behaviour: did it change?)",
			byDigest, pinned.Identified["image_disk_format"], pinned.InstanceInfo["image_disk_format"])
	}
	t.Logf("Ironic: %s identified %v, instance_info image_disk_format %v; %s identified %v, instance_info image_disk_format %v",
		want, rendered.Identified["image_disk_format"], rendered.InstanceInfo["image_disk_format"], byDigest, pinned.Identified["image_disk_format"], pinned.InstanceInfo["image_disk_format"])
}

// The oras CLI fetches the manifest, the blob and pulls the artifact, over
// plain HTTP and TLS.
func TestServeOrasTakesTheImages(t *testing.T) {
	oras, err := exec.LookPath("oras")
	if err != nil {
		testenv.Missing(t, "the oras CLI is not on PATH (hack/tools.sh installs it; make test puts it there): skipping the check with oras")
	}
	published, servers := startOCIServers(t)
	// ubuntu-plain is selected; ubuntu-hardened is not, and has no tag.
	plain := published["ubuntu-plain"]
	sum := imageSHA(t, plain)
	size, _ := plain.Fields.Size(osimage.FieldSize)
	wantManifest, manifest := osimage.OCIManifest(sum, size)
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
			if out, err := run(t, srv, "blob", "fetch", "--output", blob, repo+"@"+osimage.OCILayerDigest(sum).String()); err != nil {
				t.Fatalf("oras blob fetch: %v\n%s", err, out)
			}
			if got := fileSHA256(t, blob); got != sum.String() {
				t.Fatalf("oras blob fetch: sha256 %s, want %s", got, sum)
			}
			dir := t.TempDir()
			if out, err := run(t, srv, "pull", "--output", dir, repo+":ubuntu-plain"); err != nil {
				t.Fatalf("oras pull: %v\n%s", err, out)
			}
			if got := fileSHA256(t, filepath.Join(dir, osimage.OCILayerTitle(sum))); got != sum.String() {
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
