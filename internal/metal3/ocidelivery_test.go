package metal3

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/sylva-projects/osimages/internal/testenv"
)

const templateCRDFile = "infrastructure.cluster.x-k8s.io_metal3machinetemplates.yaml"

// capm3CRDs returns the CRD folders of CAPM3 v1.13.2 (from the module
// cache) and of a CAPM3 that accepts oci:// images (shared/crds/metal3,
// whose Metal3MachineTemplate CRD is v1.14.0-rc.0's byte for byte).
func capm3CRDs(t *testing.T) (refusing, accepting string) {
	t.Helper()
	refusing, err := testenv.CAPM3CRDs(testenv.CAPM3RefusingOCI)
	if err != nil {
		testenv.Missing(t, "CAPM3 %s's CRDs: %v", testenv.CAPM3RefusingOCI, err)
	}
	accepting = testenv.Metal3CRDs()
	if accepting == "" {
		testenv.Missing(t, "shared/crds/metal3 (the CRDs of a CAPM3 that accepts oci:// images) not found")
	}
	return refusing, accepting
}

func readCRD(t *testing.T, dir string) *apiextensionsv1.CustomResourceDefinition {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, templateCRDFile))
	if err != nil {
		t.Fatal(err)
	}
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := yaml.UnmarshalStrict(data, crd); err != nil {
		t.Fatal(err)
	}
	return crd
}

// The real CRDs: CAPM3 v1.13.2 requires image.checksum in both of its
// versions, and says so naming the version, the release needed and the
// way out; the CAPM3 of shared/ (as v1.14.0-rc.0) requires it in neither.
func TestOCIRefusalOfTheRealCRDs(t *testing.T) {
	refusingDir, acceptingDir := capm3CRDs(t)
	refusing, accepting := readCRD(t, refusingDir), readCRD(t, acceptingDir)
	for _, version := range []string{"v1beta1", "v1beta2"} {
		err := OCIRefusal(refusing, version)
		var refused *OCIRefusedError
		if !errors.As(err, &refused) || refused.Version != version {
			t.Fatalf("CAPM3 %s, %s: got %v, want an OCIRefusedError for %s", testenv.CAPM3RefusingOCI, version, err, version)
		}
		for _, want := range []string{"spec.template.spec.image.checksum", version, "CAPM3 before v1.14.0", "upgrade CAPM3 to v1.14.0 or later", "image_delivery: http"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("refusal %q does not say %q", err, want)
			}
		}
		if err := OCIRefusal(accepting, version); err != nil {
			t.Errorf("shared/ CAPM3, %s: %v, want accepted", version, err)
		}
	}
	if OCIRefusal(refusing) == nil {
		t.Error("CAPM3 v1.13.2, every version: accepted, want refused")
	}
	if err := OCIRefusal(accepting); err != nil {
		t.Errorf("shared/ CAPM3, every version: %v", err)
	}
	// A version the CRD does not serve is the apiserver's to refuse.
	if err := OCIRefusal(refusing, "v1alpha9"); err != nil {
		t.Errorf("unserved version: %v", err)
	}
}

// Through a real apiserver: the CRD as the apiserver stores and serves it,
// read by ReadOCIRefusal; no CAPM3 installed refuses nothing.
func TestReadOCIRefusalThroughTheAPIServer(t *testing.T) {
	refusingDir, _ := capm3CRDs(t)
	ctx := context.Background()

	old, err := testenv.StartKube(refusingDir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = old.Stop() })
	c, err := client.New(old.Config, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	refused, err := ReadOCIRefusal(ctx, c, "v1beta1")
	var want *OCIRefusedError
	if err != nil || !errors.As(refused, &want) {
		t.Fatalf("CAPM3 %s: got (%v, %v), want refused", testenv.CAPM3RefusingOCI, refused, err)
	}

	k, install := testenv.KubeWithoutMetal3(t)
	c, err = client.New(k.Config, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if refused, err := ReadOCIRefusal(ctx, c); refused != nil || err != nil {
		t.Fatalf("no CAPM3: got (%v, %v), want nothing refused", refused, err)
	}
	install()
	if refused, err := ReadOCIRefusal(ctx, c, "v1beta1"); refused != nil || err != nil {
		t.Fatalf("shared/ CAPM3: got (%v, %v), want accepted", refused, err)
	}
}
