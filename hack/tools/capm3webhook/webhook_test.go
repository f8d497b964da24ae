// Package capm3webhook runs the validation of CAPM3's own Metal3MachineTemplate
// webhook, from the release named in go.mod, on the image blocks render
// writes. The webhook (internal/webhooks, not importable) validates a
// template without customDeploy by Image.Validate of its api module, which
// this test calls. A module of its own: CAPM3 stays out of osimages' go.mod.
package capm3webhook

import (
	"strings"
	"testing"

	v1beta1 "github.com/metal3-io/cluster-api-provider-metal3/api/v1beta1"
	v1beta2 "github.com/metal3-io/cluster-api-provider-metal3/api/v1beta2"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

const sha = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// The image blocks render writes: oci:// with no checksum fields, and an
// image URL with its sha256.
var (
	ociURL  = "oci://192.0.2.10/images/" + sha + "@sha256:" + sha
	httpURL = "https://192.0.2.10/images/" + sha + "/ubuntu.raw"
)

// CAPM3 v1.13.2 refuses the oci:// block ("Image.Checksum: Required
// value: cannot be empty") in both API versions and accepts the image URL.
func TestCAPM3WebhookValidation(t *testing.T) {
	path := *field.NewPath("Spec", "Template", "Spec", "Image")
	checksum := sha
	for _, c := range []struct {
		name string
		errs field.ErrorList
		ok   bool
	}{
		{"v1beta1 oci", (&v1beta1.Image{URL: ociURL, DiskFormat: ptr("raw")}).Validate(path), false},
		{"v1beta2 oci", (&v1beta2.Image{URL: ociURL, DiskFormat: "raw"}).Validate(path), false},
		{"v1beta1 http", (&v1beta1.Image{URL: httpURL, Checksum: checksum, ChecksumType: ptr("sha256"), DiskFormat: ptr("raw")}).Validate(path), true},
		{"v1beta2 http", (&v1beta2.Image{URL: httpURL, Checksum: &checksum, ChecksumType: "sha256", DiskFormat: "raw"}).Validate(path), true},
	} {
		if c.ok != (len(c.errs) == 0) {
			t.Errorf("%s: %v", c.name, c.errs)
		}
		if !c.ok && !strings.Contains(c.errs.ToAggregate().Error(), "Checksum: Required value: cannot be empty") {
			t.Errorf("%s: %v, want the checksum required", c.name, c.errs)
		}
	}
}

func ptr(s string) *string { return &s }
