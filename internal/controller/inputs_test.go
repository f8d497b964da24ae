package controller

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/sylva-projects/osimages/internal/fleet"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/testenv"
)

func heapInUse() uint64 {
	var m runtime.MemStats
	for range 3 {
		runtime.GC()
	}
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// 100 cluster-values ConfigMaps of 900 KB each took the controller from
// 149 to 319 MB. A tenant input over --max-input-size is not held in
// memory: it is refused, with an event and in the status.
func TestBigTenantConfigMapsAreNotHeld(t *testing.T) {
	const label = "test-big/workload"
	const n = 100
	startManager(t, Options{
		Check:   &CheckOptions{Namespaces: labels.SelectorFromSet(labels.Set{label: ""}), ServedCopy: "served", Resync: time.Hour},
		Catalog: &CatalogOptions{},
	})
	// Let the informers start before the baseline.
	namespace(t, "big-warmup", map[string]string{label: ""})
	testenv.Eventually(t, "the check runs", 30*time.Second, func() (bool, string) {
		_, err := suite.Kube(t).Client.CoreV1().ConfigMaps("big-warmup").Get(context.Background(), osimage.StatusConfigMapName, metav1.GetOptions{})
		return err == nil, fmt.Sprint(err)
	})
	before := heapInUse()

	big := clusterValues + "padding: " + strings.Repeat("x", 900_000) + "\n"
	for i := range n {
		ns := fmt.Sprintf("big-%03d", i)
		namespace(t, ns, map[string]string{label: ""})
		put(t, ns, "values", map[string]string{fleet.ClusterValuesLabel: ""}, big)
	}
	for i := range n {
		ns := fmt.Sprintf("big-%03d", i)
		testenv.Eventually(t, ns+" refused in the status", 60*time.Second, func() (bool, string) {
			r := status(t, ns)
			return len(r.Errors) == 1 && strings.Contains(r.Errors[0], "ConfigMap "+ns+"/values holds 900") && strings.Contains(r.Errors[0], "over the 512 KiB limit"), fmt.Sprint(r.Errors)
		})
	}
	after := heapInUse()
	grew := int64(after) - int64(before)
	t.Logf("controller heap: %.1f MiB before, %.1f MiB after %d cluster-values ConfigMaps of 900 KB (%+.1f MiB)",
		float64(before)/(1<<20), float64(after)/(1<<20), n, float64(grew)/(1<<20))
	if grew > 30<<20 {
		t.Errorf("the heap grew by %d MiB: the big ConfigMaps are held", grew>>20)
	}
	testenv.Eventually(t, "ClusterInputsProblem event", 30*time.Second, func() (bool, string) {
		evs := eventNotes(t, "big-000", "ClusterInputsProblem")
		return len(evs) == 1 && strings.Contains(evs[0], "--max-input-size"), fmt.Sprint(evs)
	})

	// Several inputs that pass the limit together are refused too: what a
	// namespace makes the controller parse is bounded.
	namespace(t, "big-together", map[string]string{label: ""})
	half := clusterValues + "padding: " + strings.Repeat("x", 300_000) + "\n"
	put(t, "big-together", "values-a", map[string]string{fleet.ClusterValuesLabel: ""}, half)
	put(t, "big-together", "values-b", map[string]string{fleet.ClusterValuesLabel: ""}, half)
	testenv.Eventually(t, "the namespace's total refused", 30*time.Second, func() (bool, string) {
		r := status(t, "big-together")
		return len(r.Errors) == 1 && strings.Contains(r.Errors[0], "hold 600") && strings.Contains(r.Errors[0], "together"), fmt.Sprint(r.Errors)
	})

	// The same for catalog values: refused with an event and the status.
	namespace(t, "big-catalog", nil)
	put(t, "big-catalog", "inputs", map[string]string{fleet.CatalogValuesLabel: ""}, "padding: "+strings.Repeat("x", 900_000)+"\n")
	testenv.Eventually(t, "CatalogInputTooLarge", 30*time.Second, func() (bool, string) {
		evs := eventNotes(t, "big-catalog", "CatalogInputTooLarge")
		s := catalogStatusOf(t, "big-catalog")
		return len(evs) == 1 && strings.Contains(evs[0], "ConfigMap big-catalog/inputs holds 900") && s.State == osimage.CatalogRefused, fmt.Sprint(evs, s)
	})
}
