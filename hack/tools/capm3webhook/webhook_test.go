// Package capm3webhook runs the validation of CAPM3's own Metal3MachineTemplate
// webhook, from the release named in go.mod, on the templates render
// writes (testdata/templates.yaml, render's output, kept current by
// TestRenderWritesTheCAPM3WebhookFixture in cmd/osimages). A module of its
// own: CAPM3 stays out of osimages' go.mod.
//
// The Go module proxy answers 403 for every later version of
// github.com/metal3-io/cluster-api-provider-metal3 and of its api module
// (v1.14.0-rc.0, v1.14.0), the first that accept an oci:// image without
// a checksum. oci-commit.sh runs this test again on v1.13.2 with the api
// part of the one upstream commit that made v1.14.0-rc.0 accept it
// (CAPM3WEBHOOK_OCI_COMMIT set): the Image validation of that release.
package capm3webhook

import (
	"os"
	"strings"
	"testing"

	v1beta1 "github.com/metal3-io/cluster-api-provider-metal3/api/v1beta1"
	v1beta2 "github.com/metal3-io/cluster-api-provider-metal3/api/v1beta2"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/yaml"
)

// validate is what CAPM3's webhook (internal/webhooks/v1beta2, not
// importable) checks of a template: its image, unless it has a custom
// deploy. The webhook serves v1beta2 only; the apiserver converts a
// v1beta1 template to it first (matchPolicy Equivalent), with the api
// module's own conversion.
func validate(t *testing.T, doc []byte) (url string, errs field.ErrorList) {
	t.Helper()
	var head struct {
		APIVersion string `json:"apiVersion"`
	}
	if err := yaml.Unmarshal(doc, &head); err != nil {
		t.Fatal(err)
	}
	hub := &v1beta2.Metal3MachineTemplate{}
	switch head.APIVersion {
	case v1beta2.GroupVersion.String():
		// Strict: every field render writes is one CAPM3 knows.
		if err := yaml.UnmarshalStrict(doc, hub); err != nil {
			t.Fatalf("%v\n%s", err, doc)
		}
	case v1beta1.GroupVersion.String():
		old := &v1beta1.Metal3MachineTemplate{}
		if err := yaml.UnmarshalStrict(doc, old); err != nil {
			t.Fatalf("%v\n%s", err, doc)
		}
		if err := old.ConvertTo(hub); err != nil {
			t.Fatal(err)
		}
	default:
		t.Fatalf("apiVersion %q\n%s", head.APIVersion, doc)
	}
	if hub.Spec.Template.Spec.CustomDeploy.Method != "" {
		return hub.Spec.Template.Spec.Image.URL, nil
	}
	return hub.Spec.Template.Spec.Image.URL, hub.Spec.Template.Spec.Image.Validate(*field.NewPath("Spec", "Template", "Spec", "Image"))
}

// CAPM3 v1.13.2 refuses render's oci:// templates ("Image.Checksum:
// Required value: cannot be empty") in both API versions, and accepts its
// image URL templates. With the oci:// commit, it accepts both: render
// writes neither a checksum nor a checksum type for oci://, which that
// commit forbids.
func TestCAPM3WebhookValidation(t *testing.T) {
	ociCommit := os.Getenv("CAPM3WEBHOOK_OCI_COMMIT") != ""
	stream, err := os.ReadFile("testdata/templates.yaml")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, doc := range strings.Split(string(stream), "\n---\n")[1:] {
		url, errs := validate(t, []byte(doc))
		switch {
		case strings.HasPrefix(url, "oci://"):
			seen["oci"]++
			switch {
			case ociCommit && len(errs) != 0:
				t.Errorf("%s: %v, want it accepted with the oci:// commit\n%s", url, errs, doc)
			case !ociCommit && (len(errs) == 0 || !strings.Contains(errs.ToAggregate().Error(), "Checksum: Required value: cannot be empty")):
				t.Errorf("%s: %v, want the checksum required\n%s", url, errs, doc)
			}
		case strings.HasPrefix(url, "https://"):
			seen["https"]++
			if len(errs) != 0 {
				t.Errorf("%s: %v, want it accepted\n%s", url, errs, doc)
			}
		default:
			t.Errorf("image URL %q\n%s", url, doc)
		}
	}
	// Both API versions, the control plane's and md0's of each delivery.
	if seen["oci"] != 4 || seen["https"] != 4 {
		t.Errorf("templates judged: %v, want 4 oci:// and 4 https://", seen)
	}
}
