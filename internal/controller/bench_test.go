package controller

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/sylva-projects/osimages/internal/fleet"
	osikube "github.com/sylva-projects/osimages/internal/kube"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/propagate"
	"github.com/sylva-projects/osimages/internal/testenv"
)

// BenchmarkFleetReaction measures what an operator waits for: from a
// change of the management cluster's served set to every one of 500
// workload namespaces reporting it in osimages-status, through
// propagation and the check in one manager. Run it with
//
//	go test -run '^$' -bench FleetReaction -benchtime 3x ./internal/controller
func BenchmarkFleetReaction(b *testing.B) {
	const n = 500
	const label = "bench-fleet/workload"
	ctx := context.Background()
	info, err := osimage.MarshalInfo(osimage.Catalog{"ubuntu": {"sha256": sum("u"), "filename": "u.raw", "image-format": "raw", "os": "ubuntu",
		"k8s-flavor": "rke2", "k8s-version": "1.32.5+rke2r1"}})
	if err != nil {
		b.Fatal(err)
	}
	served := func(with bool) string {
		if !with {
			return "capm3_os_image_server_images: {}\n"
		}
		return "capm3_os_image_server_images:\n  " + sum("u") + ": {available: true, image_key: m}\n"
	}
	cms := suite.Kube(b).Client.CoreV1()
	// The benchmark function runs more than once; the fleet and its
	// manager are set up once and live until the process ends.
	benchOnce.Do(func() { benchSource, benchSetupErr = setUpFleet(b, n, label, served, string(info)) })
	if benchSetupErr != nil {
		b.Fatal(benchSetupErr)
	}
	source := benchSource
	allReport := func(want osimage.ImageState) {
		testenv.Poll(b, fmt.Sprintf("every namespace reports %s", want), 5*time.Minute, 100*time.Millisecond, func() (bool, string) {
			got := countReporting(b, want)
			return got == n, fmt.Sprintf("%d of %d", got, n)
		})
	}
	with := strings.Contains(source.Data["values.yaml"], sum("u"))
	b.ResetTimer()
	for range b.N {
		with = !with
		source.Data = map[string]string{"values.yaml": served(with)}
		if source, err = cms.ConfigMaps("bench-mgmt").Update(ctx, source, metav1.UpdateOptions{}); err != nil {
			b.Fatal(err)
		}
		want := osimage.StateNotServed
		if with {
			want = osimage.StateServed
		}
		allReport(want)
	}
	b.StopTimer()
	benchSource = source
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	b.ReportMetric(float64(ms.HeapInuse)/(1<<20), "MiB-heap")
}

var (
	benchOnce     sync.Once
	benchSource   *corev1.ConfigMap
	benchSetupErr error
)

// setUpFleet creates the management source and n workload namespaces,
// starts the manager, and reports how long the first check of all took.
func setUpFleet(b *testing.B, n int, label string, served func(bool) string, info string) (*corev1.ConfigMap, error) {
	ctx := context.Background()
	cms := suite.Kube(b).Client.CoreV1()
	if _, err := cms.Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "bench-mgmt"}}, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	source := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "served", Namespace: "bench-mgmt"}, Data: map[string]string{"values.yaml": served(true)}}
	source, err := cms.ConfigMaps("bench-mgmt").Create(ctx, source, metav1.CreateOptions{})
	if err != nil {
		return nil, err
	}
	var g errgroup.Group
	g.SetLimit(16)
	for i := range n {
		g.Go(func() error {
			ns := fmt.Sprintf("bench-%03d", i)
			if _, err := cms.Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{label: ""}}}, metav1.CreateOptions{}); err != nil {
				return err
			}
			for name, doc := range map[string]string{"os-images-info": info, "values": clusterValues} {
				cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Data: map[string]string{"values.yaml": doc}}
				if name == "values" {
					cm.Labels = map[string]string{fleet.ClusterValuesLabel: ""}
				}
				if _, err := cms.ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
					return err
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	sel := labels.SelectorFromSet(labels.Set{label: ""})
	rules := []propagate.Rule{{Name: "bench", Source: osikube.ObjectKey{Namespace: "bench-mgmt", Name: "served"}, Target: "served", Selector: sel}}
	mgr, err := NewManager(suite.Kube(b).Config, Options{
		Propagate:      &propagate.Options{Rules: rules},
		Check:          &CheckOptions{Namespaces: sel, ServedCopy: "served", Resync: time.Hour},
		Workers:        8,
		Registerer:     prometheus.NewRegistry(),
		ManagerOptions: osikube.ManagerOptions{Logger: logr.Discard()},
	})
	if err != nil {
		return nil, err
	}
	start := time.Now()
	go func() { _ = mgr.Start(context.Background()) }()
	testenv.Poll(b, fmt.Sprintf("the first check of %d namespaces", n), 5*time.Minute, 100*time.Millisecond, func() (bool, string) {
		got := countReporting(b, osimage.StateServed)
		return got >= n, fmt.Sprintf("%d of %d", got, n)
	})
	fmt.Printf("first check of %d namespaces (copies and statuses written): %.2fs\n", n, time.Since(start).Seconds())
	return source, nil
}

// countReporting counts the bench namespaces whose status has the one
// image in state want.
func countReporting(b *testing.B, want osimage.ImageState) int {
	list, err := suite.Kube(b).Client.CoreV1().ConfigMaps("").List(context.Background(), metav1.ListOptions{LabelSelector: osimage.StatusLabel})
	if err != nil {
		b.Fatal(err)
	}
	count := 0
	for _, cm := range list.Items {
		r, err := osimage.ParseCheckReport(cm.Data[osimage.StatusKey])
		if err == nil && strings.HasPrefix(r.Namespace, "bench-") && len(r.Images) == 1 && r.Images[0].State == want {
			count++
		}
	}
	return count
}
