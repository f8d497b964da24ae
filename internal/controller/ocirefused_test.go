package controller

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/sylva-projects/osimages/internal/fleet"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/testenv"
)

// TestCheckReportsACAPM3ThatRefusesOCI: on an apiserver with the real CRDs
// of CAPM3 v1.13.2, whose Metal3MachineTemplate requires image.checksum,
// cluster values that ask for image_delivery: oci are an input problem of
// the namespace, in its status and as a ClusterInputsProblem event, naming
// the level, the release needed and the fix: the next render would fail.
// CAPM3 upgraded in place (the CRDs of shared/, v1.14.0-rc.0's
// Metal3MachineTemplate) clears it at the next resync, without a restart:
// the CRD is read at each check.
func TestCheckReportsACAPM3ThatRefusesOCI(t *testing.T) {
	refusingCRDs, err := testenv.CAPM3CRDs(testenv.CAPM3RefusingOCI)
	if err != nil {
		testenv.Missing(t, "CAPM3 %s's CRDs: %v", testenv.CAPM3RefusingOCI, err)
	}
	accepting := testenv.Metal3CRDs()
	if accepting == "" {
		testenv.Missing(t, "shared/crds/metal3 (a CAPM3 that accepts oci:// images) not found")
	}
	k, err := testenv.StartKube(refusingCRDs)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k.Stop() })

	const label, ns = "test-capm3-oci/workload", "capm3-oci"
	k.Namespace(t, ns, map[string]string{label: ""})
	info, err := osimage.MarshalInfo(osimage.Catalog{"ubuntu": {"sha256": sum("u"), "filename": "u.raw", "image-format": "raw", "size": "1048576",
		"os": "ubuntu", "k8s-flavor": "rke2", "k8s-version": "1.32.5+rke2r1"}})
	if err != nil {
		t.Fatal(err)
	}
	putOn(t, k, ns, osimage.InfoConfigMapName, nil, string(info))
	putOn(t, k, ns, "served", nil, "capm3_os_image_server_images:\n  "+sum("u")+": {available: true, image_key: ubuntu}\n")
	putOn(t, k, ns, "values", map[string]string{fleet.ClusterValuesLabel: ""},
		strings.Replace(clusterValues, "capm3: {", "capm3: {image_delivery: oci, ", 1))
	startManagerOn(t, k, Options{Check: &CheckOptions{
		Namespaces: labels.SelectorFromSet(labels.Set{label: ""}), ServedCopy: "served", Resync: time.Second,
	}})

	refusal := func(s string) bool {
		for _, want := range []string{
			"ConfigMap " + ns + "/values .control_plane.capm3.image_delivery: oci: the installed Cluster API Provider Metal3 requires spec.template.spec.image.checksum",
			"(CAPM3 before v1.14.0)", "upgrade CAPM3 to v1.14.0 or later, or set image_delivery: http",
		} {
			if !strings.Contains(s, want) {
				return false
			}
		}
		return true
	}
	statusOn := func() osimage.CheckReport {
		cm, err := k.Client.CoreV1().ConfigMaps(ns).Get(context.Background(), osimage.StatusConfigMapName, metav1.GetOptions{})
		if err != nil {
			return osimage.CheckReport{}
		}
		r, _ := osimage.ParseCheckReport(cm.Data[osimage.StatusKey])
		return r
	}
	testenv.Eventually(t, "the refusal in the namespace's status", 60*time.Second, func() (bool, string) {
		r := statusOn()
		return len(r.Errors) == 1 && refusal(r.Errors[0]), fmt.Sprint(r)
	})
	testenv.Eventually(t, "one ClusterInputsProblem event naming the release", 30*time.Second, func() (bool, string) {
		list, err := k.Client.EventsV1().Events(ns).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		var notes []string
		for _, e := range list.Items {
			if e.Reason == reasonInputs {
				notes = append(notes, e.Note)
			}
		}
		return len(notes) == 1 && refusal(notes[0]), fmt.Sprint(notes)
	})

	// CAPM3 upgraded: its CRDs replaced by ones that take oci:// images.
	if _, err := envtest.InstallCRDs(k.Config, envtest.CRDInstallOptions{Paths: []string{accepting}, ErrorIfPathMissing: true}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "the refusal gone at a resync after the upgrade", 60*time.Second, func() (bool, string) {
		r := statusOn()
		return len(r.Errors) == 0 && len(r.Images) == 1 && len(r.Problems()) == 0, fmt.Sprint(r)
	})
}
