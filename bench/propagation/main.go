// Command propagation compares, in one run on one machine, `osimages
// propagate` with Kyverno 1.19.1 running Sylva's clone policy (generate,
// clone, synchronize, generateExisting), as shared/docs/benchmarks.md
// ("Propagation") and kyverno-baseline.md define it.
//
// Each system gets a fresh envtest apiserver of its own, set up the same way
// (Kyverno's CRDs installed in both): the source ConfigMap, and N labelled
// namespaces. The controllers run as separate processes, so that their RSS
// is their own. For each, it measures the time until every namespace has its
// copy, then, for each of several source updates, the seconds from the
// update until all N copies carry it, and the peak RSS of the controller's
// processes (both of Kyverno's: its admission controller turns source
// changes into update requests that its background controller carries out)
// and of the apiserver's etcd and kube-apiserver, which hold every copy.
//
// The served set has -served images; with -catalog-images K, each
// namespace also holds an os-images-info of K images (the one the updates
// change, K-2 others of the served set spread over the namespaces, and one
// that is not served), and osimages' copies are expected to hold what that
// catalog can pick (-osimages-copies filtered), or the whole set
// (-osimages-copies whole: the binary of a release that copied it whole).
//
// With -floor, a third system writes the same copies from the bench itself
// and nothing else (floor.go): what the copies alone cost etcd and the
// apiserver, which osimages' figures are then held to.
//
// hack/bench-propagation.sh builds everything and runs it.
package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"maps"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/propagate"
	"github.com/sylva-projects/osimages/internal/testenv"
)

type config struct {
	namespaces  int
	updates     int
	osimages    string
	kyvernoBin  string
	kyvernoCRDs string
	timeout     time.Duration
	keepLogs    bool
	existing    bool
	// served is the size of the served set; catalogImages the size of each
	// namespace's catalog (0: no catalogs).
	served        int
	catalogImages int
	// filtered: osimages' copies hold what their catalog can pick.
	filtered bool
	// osimagesArgs are more flags for `osimages propagate`.
	osimagesArgs []string
	// profiles, when set, is where the apiserver's heap profile and RSS are
	// saved at each phase.
	profiles string
	// floor: also measure the apiserver under the copies' writes alone.
	floor bool
}

func main() {
	var c config
	flag.IntVar(&c.namespaces, "namespaces", 500, "labelled namespaces, each getting a copy")
	flag.IntVar(&c.updates, "updates", 3, "source updates timed per system; the median is compared")
	flag.StringVar(&c.osimages, "osimages", "bin/osimages", "osimages binary")
	flag.StringVar(&c.kyvernoBin, "kyverno-bin", "", "folder with Kyverno's kyverno and background-controller binaries (empty: osimages only)")
	flag.StringVar(&c.kyvernoCRDs, "kyverno-crds", "", "Kyverno's config/crds folder")
	flag.DurationVar(&c.timeout, "timeout", 10*time.Minute, "time allowed for one propagation before it is reported as not finished")
	flag.BoolVar(&c.existing, "existing", false, "create the namespaces before the controllers start (Kyverno then relies on generateExisting); by default they are created once the controllers are ready, as workload clusters appear")
	flag.BoolVar(&c.keepLogs, "keep-logs", false, "keep the controllers' logs, and print where")
	extra := flag.String("osimages-args", "", "more flags for osimages propagate, space-separated (e.g. \"--workers 16\")")
	flag.IntVar(&c.served, "served", 30, "images in the served set")
	flag.IntVar(&c.catalogImages, "catalog-images", 0, "images in each namespace's os-images-info (0: no catalogs); one is not served")
	flag.StringVar(&c.profiles, "apiserver-profiles", "", "folder where kube-apiserver's heap profile (/debug/pprof/heap) is saved at each phase, with its RSS (empty: none)")
	flag.BoolVar(&c.floor, "floor", false, "also measure, on a fresh apiserver, the same copies written by the bench itself and nothing else: what the copies alone cost etcd and the apiserver")
	copies := flag.String("osimages-copies", "filtered", "what osimages' copies hold: filtered (what the namespace's catalog can pick: nothing without catalogs) or whole (a binary, or rules, that copy the whole set)")
	flag.Parse()
	switch *copies {
	case "filtered":
		c.filtered = true
	case "whole":
	default:
		fmt.Fprintf(os.Stderr, "bench-propagation: -osimages-copies %q: want filtered or whole\n", *copies)
		os.Exit(2)
	}
	if c.served < 1 || c.catalogImages < 0 || c.catalogImages > c.served+1 {
		fmt.Fprintf(os.Stderr, "bench-propagation: -served %d, -catalog-images %d: want at least 1 served image, and at most served+1 catalog images\n", c.served, c.catalogImages)
		os.Exit(2)
	}
	c.osimagesArgs = strings.Fields(*extra)
	// An interrupted run still stops the controllers and apiservers it
	// started.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, c); err != nil {
		fmt.Fprintln(os.Stderr, "bench-propagation:", err)
		os.Exit(1)
	}
}

// result is what one system measured.
type result struct {
	name    string
	fill    time.Duration
	updates []time.Duration // -1: not finished within the timeout
	peakRSS int64           // bytes: peak of the sum over the processes, sampled
	hwm     map[string]int64
	// apiserver is the peak RSS of etcd and kube-apiserver, and their RSS
	// at the end of the run.
	apiserver, apiserverEnd map[string]int64
	cpu                     time.Duration // user+system time of the processes
	notes                   string        // notes: what did not finish, restarts
}

func (r result) median() time.Duration {
	s := slices.Clone(r.updates)
	slices.Sort(s)
	if len(s) == 0 {
		return -1
	}
	if slices.Contains(s, -1) {
		return -1
	}
	return s[len(s)/2]
}

func run(ctx context.Context, c config) error {
	if _, err := os.Stat(c.osimages); err != nil {
		return fmt.Errorf("osimages binary: %w (hack/bench-propagation.sh builds it)", err)
	}
	var crds []string
	if c.kyvernoCRDs != "" {
		for _, d := range []string{"kyverno", "policies.kyverno.io", "policyreport", "reports"} {
			crds = append(crds, filepath.Join(c.kyvernoCRDs, d))
		}
	}
	fmt.Fprintf(os.Stderr, "propagation benchmark: %d namespaces, %d served images, catalogs of %d images, %d source updates per system\n", c.namespaces, c.served, c.catalogImages, c.updates)

	ours, err := measure(ctx, c, crds, osimagesSystem(c.osimages, c.osimagesArgs))
	if err != nil {
		return fmt.Errorf("osimages: %w", err)
	}
	results := []result{ours}
	if c.floor {
		floor, err := measure(ctx, c, crds, floorSystem(c))
		if err != nil {
			return fmt.Errorf("writes alone: %w", err)
		}
		results = append(results, floor)
	}
	var kyvernoErr error
	if c.kyvernoBin != "" {
		theirs, err := measure(ctx, c, crds, kyvernoSystem(c.kyvernoBin))
		if err != nil {
			kyvernoErr = err
		} else {
			results = append(results, theirs)
		}
	}
	missed := report(c, results)
	if kyvernoErr != nil {
		return fmt.Errorf("kyverno: %w", kyvernoErr)
	}
	if missed {
		return errors.New("a target was missed")
	}
	return nil
}

// floorTarget bounds what osimages may cost etcd and the apiserver beyond
// what its copies cost them (-floor): at 2,000 namespaces the copies alone
// hold the apiserver over 500 MiB, so a bound in MiB would measure the
// apiserver, not the controller.
const floorTarget = 1.10

// report prints the table, and says whether a target it checks was missed.
func report(c config, rs []result) (missed bool) {
	secs := func(d time.Duration) string {
		if d < 0 {
			return fmt.Sprintf(">%.0f", c.timeout.Seconds())
		}
		return fmt.Sprintf("%.2f", d.Seconds())
	}
	mib := func(b int64) string { return fmt.Sprintf("%.0f", float64(b)/(1<<20)) }
	when := "created once the controllers were ready"
	if c.existing {
		when = "created before the controllers started"
	}
	fmt.Printf("\nPropagation to %d namespaces (%s), %d source updates each\n", c.namespaces, when, c.updates)
	catalogs := "no catalogs"
	if c.catalogImages > 0 {
		catalogs = fmt.Sprintf("an os-images-info of %d images in each namespace", c.catalogImages)
	}
	copies := "the whole served set"
	if c.filtered {
		copies = "what its namespace's catalog can pick"
	}
	fmt.Printf("Served set of %d images, %s; osimages' copies expected to hold %s\n\n", c.served, catalogs, copies)
	fmt.Printf("%-16s %12s %26s %14s %12s %s\n", "system", "fill (s)", "update->all copies (s)", "median (s)", "peak RSS", "CPU (s)")
	for _, r := range rs {
		ups := make([]string, len(r.updates))
		for i, u := range r.updates {
			ups[i] = secs(u)
		}
		var hwm []string
		for _, name := range slices.Sorted(maps.Keys(r.hwm)) {
			hwm = append(hwm, fmt.Sprintf("%s %s MiB", name, mib(r.hwm[name])))
		}
		median := "-"
		if len(r.updates) > 0 {
			median = secs(r.median())
		}
		if len(r.hwm) == 0 {
			// The writes alone run in the bench's process: no figure of
			// their own.
			fmt.Printf("%-16s %12s %26s %14s %12s %s\n", r.name, secs(r.fill), strings.Join(ups, " "), median, "-", "-")
		} else {
			fmt.Printf("%-16s %12s %26s %14s %8s MiB %.1f   (peak per process: %s)\n", r.name, secs(r.fill), strings.Join(ups, " "), median, mib(r.peakRSS), r.cpu.Seconds(), strings.Join(hwm, ", "))
		}
		var apiserver []string
		for _, name := range slices.Sorted(maps.Keys(r.apiserver)) {
			apiserver = append(apiserver, fmt.Sprintf("%s %s MiB (%s at the end)", name, mib(r.apiserver[name]), mib(r.apiserverEnd[name])))
		}
		fmt.Printf("%-16s peak RSS of %s\n", "", strings.Join(apiserver, ", "))
		if r.notes != "" {
			fmt.Printf("    %s\n", r.notes)
		}
	}
	ours := rs[0]
	for _, floor := range rs[1:] {
		if floor.name != floorSystem(c).name {
			continue
		}
		fmt.Println()
		for _, name := range slices.Sorted(maps.Keys(ours.apiserver)) {
			ratio := float64(ours.apiserver[name]) / float64(floor.apiserver[name])
			verdict := "met"
			if ratio > floorTarget {
				verdict, missed = "NOT met", true
			}
			fmt.Printf("%s: peak RSS %s MiB under osimages, %s MiB under the copies' writes alone (%+.0f MiB, %.2fx; target <= %.2fx: %s)\n", name,
				mib(ours.apiserver[name]), mib(floor.apiserver[name]),
				float64(ours.apiserver[name]-floor.apiserver[name])/(1<<20), ratio, floorTarget, verdict)
		}
	}
	i := slices.IndexFunc(rs, func(r result) bool { return r.name == kyvernoName })
	if i < 0 {
		fmt.Println("\nNo baseline measured (no -kyverno-bin): ratios not computed.")
		return missed
	}
	theirs := rs[i]
	fmt.Println()
	switch {
	case theirs.fill < 0:
		fmt.Printf("speed: Kyverno did not create every copy within %s, so no update could be timed; osimages filled in %s s and updated all copies in %s s (median)\n",
			c.timeout, secs(ours.fill), secs(ours.median()))
	case theirs.median() < 0 && ours.median() > 0:
		fmt.Printf("speed: Kyverno did not carry an update to every copy within %s; osimages took %s s: more than %.0fx faster (target >= 5x)\n",
			c.timeout, secs(ours.median()), c.timeout.Seconds()/ours.median().Seconds())
	case theirs.median() >= 0 && ours.median() > 0:
		fmt.Printf("speed: osimages %.1fx faster than Kyverno, median update to all copies (target >= 5x)\n", theirs.median().Seconds()/ours.median().Seconds())
	}
	if theirs.fill > 0 && ours.fill > 0 {
		fmt.Printf("fill: osimages %.1fx faster at creating every copy\n", theirs.fill.Seconds()/ours.fill.Seconds())
	}
	fmt.Printf("memory: osimages peak RSS is %.2fx Kyverno's (target <= 0.5x)\n", float64(ours.peakRSS)/float64(theirs.peakRSS))
	return missed
}

// system starts the controller under test against k and returns its
// processes once it is ready to propagate.
type system struct {
	name  string
	start func(ctx context.Context, k *testenv.Kube, dir string) ([]*proc, error)
}

func osimagesSystem(binary string, extra []string) system {
	return system{name: "osimages", start: func(ctx context.Context, k *testenv.Kube, dir string) ([]*proc, error) {
		args := append([]string{"propagate", "--kubeconfig", k.Kubeconfig, "--metrics-addr", "0", "--health-addr", "0"}, extra...)
		p, err := startProc("osimages", dir, false, nil, binary, args...)
		if err != nil {
			return nil, err
		}
		return []*proc{p}, nil
	}}
}

// servedSet is a served set like the image server's, with n images;
// version changes the entry of the first one, which every catalog names.
func servedSet(n, version int) osimage.ServedSet {
	set := make(osimage.ServedSet, n)
	for i := range n {
		key := fmt.Sprintf("ubuntu-noble-hardened-rke2-1-32-%d", i)
		if i == 0 {
			key = fmt.Sprintf("%s-v%d", key, version)
		}
		set[imageSHA256(i)] = osimage.ServedImage{Available: true, ImageKey: key}
	}
	return set
}

// imageSHA256 is the sha256 of the bench's image i.
func imageSHA256(i int) osimage.SHA256 {
	sha, err := osimage.ParseSHA256(fmt.Sprintf("%064x", i+1))
	if err != nil {
		panic(err)
	}
	return sha
}

func servedValues(n, version int) string {
	doc, err := osimage.MarshalServed(servedSet(n, version))
	if err != nil {
		panic(err)
	}
	return string(doc)
}

// catalogImages lists the images of namespace ns's catalog: the first
// image, K-2 others of the served set spread over the namespaces, and one
// that is not served (index served+ns).
func catalogImages(c config, ns int) []int {
	if c.catalogImages == 0 {
		return nil
	}
	out := []int{0}
	for j := 1; j < c.catalogImages-1; j++ {
		out = append(out, 1+(ns*(c.catalogImages-2)+j-1)%max(c.served-1, 1))
	}
	if c.catalogImages > 1 {
		out = append(out, c.served+ns)
	}
	return out
}

// catalogDoc is the os-images-info document of namespace ns, each image
// described with every field the catalog writes.
func catalogDoc(c config, ns int) string {
	cat := osimage.Catalog{}
	for _, i := range catalogImages(c, ns) {
		name := fmt.Sprintf("ubuntu-noble-hardened-rke2-1-32-%d", i)
		cat[name] = osimage.Image{
			"uri":                    "oci://registry.example.org/sylva-projects/sylva-elements/diskimage-builder/" + name + ":0.7.6",
			"oci-image-registry-key": "sylva", "oci-manifest-digest": "sha256:" + strings.Repeat("ab", 32),
			"sha256": string(imageSHA256(i)), "md5": strings.Repeat("cd", 16), "filename": name + ".raw",
			"image-format": "raw", "compression": "gz", "archive-size": "2150474837", "size": "22000000000",
			"os": "ubuntu", "os-release": "noble", "flavor": "hardened", "hardened": "true", "k8s-flavor": "rke2",
			"k8s-version": "1.32.5+rke2r1", "commit-id": strings.Repeat("0123456789", 4), "commit-tag": "0.7.6",
		}
	}
	doc, err := osimage.MarshalInfo(cat)
	if err != nil {
		panic(err)
	}
	return string(doc)
}

// wantCopies is what every namespace's copy must carry for version of the
// source, by namespace.
func wantCopies(c config, filtered bool, version int) map[string]string {
	all := servedSet(c.served, version)
	c.filtered = filtered
	out := make(map[string]string, c.namespaces)
	for ns := range c.namespaces {
		out[namespaceName(ns)] = filteredValues(c, all, ns)
	}
	return out
}

// filteredValues is the values.yaml of namespace ns's copy of the served
// set all: what its catalog can pick, or all of it when copies are whole.
func filteredValues(c config, all osimage.ServedSet, ns int) string {
	kept := all
	if c.filtered {
		kept = osimage.ServedSet{}
		for _, i := range catalogImages(c, ns) {
			if e, ok := all[imageSHA256(i)]; ok {
				kept[imageSHA256(i)] = e
			}
		}
	}
	doc, err := osimage.MarshalServed(kept)
	if err != nil {
		panic(err)
	}
	return string(doc)
}

func namespaceName(i int) string { return fmt.Sprintf("wc-%03d", i) }

func measure(ctx context.Context, c config, crds []string, sys system) (result, error) {
	r := result{name: sys.name}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	fmt.Fprintf(os.Stderr, "%s: starting a fresh apiserver\n", sys.name)
	k, err := testenv.StartKube(crds...)
	if err != nil {
		return r, err
	}
	defer k.Stop()
	dir, err := os.MkdirTemp("", "bench-propagation-")
	if err != nil {
		return r, err
	}
	if c.keepLogs {
		fmt.Fprintf(os.Stderr, "%s: logs in %s\n", sys.name, dir)
	} else {
		defer os.RemoveAll(dir)
	}

	if err := setup(ctx, k.Client, c); err != nil {
		return r, err
	}
	if c.existing {
		if err := createNamespaces(ctx, k.Client, c); err != nil {
			return r, err
		}
	}
	apiserver, err := apiserverProcs()
	if err != nil {
		return r, err
	}
	phase := func(name string) {
		if c.profiles != "" {
			saveProfile(ctx, k.Client, apiserver, filepath.Join(c.profiles, sys.name+"-"+name))
		}
	}
	phase("0-before")
	filtered := c.filtered && sys.name != kyvernoName
	w, err := watchCopies(ctx, k.Config, propagate.DefaultTargetName)
	if err != nil {
		return r, err
	}

	t0 := time.Now()
	procs, err := sys.start(ctx, k, dir)
	defer func() {
		for _, p := range procs {
			p.stop()
		}
	}()
	if err != nil {
		return r, err
	}
	sampler := sampleRSS(procs)
	apiserverSampler := sampleRSS(apiserver)
	switch {
	case !c.existing:
		// The namespaces appear once the controller runs (osimages'
		// process started, Kyverno's policy Ready), as workload clusters
		// do; the fill is timed from their creation, osimages' own start
		// included.
		t0 = time.Now()
		if err := createNamespaces(ctx, k.Client, c); err != nil {
			return r, err
		}
	case sys.name != "osimages":
		// Kyverno's start is timed from its policy being ready.
		t0 = time.Now()
	}
	fmt.Fprintf(os.Stderr, "%s: waiting for %d copies\n", sys.name, c.namespaces)
	if n, ok := w.wait(ctx, wantCopies(c, filtered, 0), c.timeout); ok {
		r.fill = time.Since(t0)
	} else {
		r.fill = -1
		r.notes = fmt.Sprintf("fill: %d of %d copies after %s. ", n, c.namespaces, c.timeout)
	}
	phase("1-filled")
	for i := 1; i <= c.updates && r.fill >= 0 && ctx.Err() == nil; i++ {
		time.Sleep(2 * time.Second)
		want := wantCopies(c, filtered, i)
		start := time.Now()
		if err := updateSource(ctx, k.Client, servedValues(c.served, i)); err != nil {
			return r, err
		}
		n, ok := w.wait(ctx, want, c.timeout)
		took := time.Since(start)
		if ok {
			fmt.Fprintf(os.Stderr, "%s: update %d reached %d copies in %s\n", sys.name, i, n, took.Round(time.Millisecond))
		} else {
			took = -1
			r.notes += fmt.Sprintf("update %d: %d of %d copies after %s. ", i, n, c.namespaces, c.timeout)
			fmt.Fprintf(os.Stderr, "%s: update %d reached only %d of %d copies in %s\n", sys.name, i, n, c.namespaces, c.timeout)
		}
		r.updates = append(r.updates, took)
		phase(fmt.Sprintf("%d-update", i+1))
	}
	if ctx.Err() != nil {
		return r, fmt.Errorf("interrupted: %w", ctx.Err())
	}
	// The peak of the summed RSS as sampled, or the kernel's exact peak of
	// one process if higher: a lower bound of the true peak either way.
	r.peakRSS = sampler.stop()
	apiserverSampler.stop()
	r.apiserver, r.apiserverEnd = map[string]int64{}, map[string]int64{}
	for _, p := range apiserver {
		r.apiserver[p.name], r.apiserverEnd[p.name] = p.hwm(), p.rss()
	}
	r.hwm = map[string]int64{}
	for _, p := range procs {
		r.hwm[p.name] = p.hwm()
		r.peakRSS = max(r.peakRSS, r.hwm[p.name])
		r.cpu += p.cpu()
		if n := p.restartCount(); n > 0 {
			r.notes += fmt.Sprintf("%s restarted %d times. ", p.name, n)
		}
	}
	for _, p := range procs {
		if err := p.exited(); err != nil {
			return r, fmt.Errorf("%s exited early: %w; log in %s", p.name, err, p.logPath)
		}
	}
	return r, nil
}

// setup creates the source.
func setup(ctx context.Context, c kubernetes.Interface, cfg config) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: osimage.ServedConfigMapNamespace}}
	if _, err := c.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		return err
	}
	src := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: osimage.ServedConfigMapNamespace, Name: osimage.ServedConfigMapName},
		Data:       map[string]string{osimage.ValuesKey: servedValues(cfg.served, 0)},
	}
	_, err := c.CoreV1().ConfigMaps(src.Namespace).Create(ctx, src, metav1.CreateOptions{})
	return err
}

// createNamespaces creates the labelled namespaces, each with its
// catalog when there are catalogs, 16 at a time. A refusal is retried for
// a while: Kyverno's webhook (failure policy Fail) may refuse writes for
// some seconds after its policy is Ready, until its certificate is served.
func createNamespaces(ctx context.Context, c kubernetes.Interface, cfg config) error {
	return parallel(cfg.namespaces, func(i int) error {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
			Name:   namespaceName(i),
			Labels: map[string]string{propagate.WorkloadClusterLabel: ""},
		}}
		deadline := time.Now().Add(2 * time.Minute)
		for {
			_, err := c.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{})
			if err == nil || apierrors.IsAlreadyExists(err) {
				err = nil
				if cfg.catalogImages > 0 {
					cm := &corev1.ConfigMap{
						ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: osimage.InfoConfigMapName, Labels: map[string]string{osimage.InfoLabel: ""}},
						Data:       map[string]string{osimage.ValuesKey: catalogDoc(cfg, i)},
					}
					if _, err = c.CoreV1().ConfigMaps(ns.Name).Create(ctx, cm, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
						err = nil
					}
				}
				if err == nil {
					return nil
				}
			}
			if time.Now().After(deadline) || ctx.Err() != nil {
				return fmt.Errorf("creating namespace %s: %w", ns.Name, err)
			}
			time.Sleep(time.Second)
		}
	})
}

func parallel(n int, f func(int) error) error {
	errs := make(chan error, n)
	sem := make(chan struct{}, 16)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			errs <- f(i)
		}()
	}
	wg.Wait()
	close(errs)
	var all []error
	for err := range errs {
		all = append(all, err)
	}
	return errors.Join(all...)
}

func updateSource(ctx context.Context, c kubernetes.Interface, values string) error {
	cms := c.CoreV1().ConfigMaps(osimage.ServedConfigMapNamespace)
	// Kyverno labels the source, so the write retries on a conflict.
	for {
		src, err := cms.Get(ctx, osimage.ServedConfigMapName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		src.Data = map[string]string{osimage.ValuesKey: values}
		_, err = cms.Update(ctx, src, metav1.UpdateOptions{})
		if err == nil || !strings.Contains(err.Error(), "the object has been modified") {
			return err
		}
	}
}

// copyWatcher follows every object of the target name. It watches their
// metadata only and reads each changed copy with a GET, a few at a time:
// one watch carrying whole copies (2,000 x 137 KiB at every update of a
// 1,000-image served set) falls behind, and the apiserver closes a watch
// that falls behind; a GET cannot. It keeps a hash of each copy's
// values.yaml, not the copies.
type copyWatcher struct {
	mu     sync.Mutex
	values map[string]string // namespace -> hex sha256 of values.yaml
	change chan struct{}
}

func watchCopies(ctx context.Context, cfg *rest.Config, target string) (*copyWatcher, error) {
	cfg = rest.CopyConfig(cfg)
	cfg.QPS, cfg.Burst = 1000, 2000
	md, err := metadata.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	w := &copyWatcher{values: map[string]string{}, change: make(chan struct{}, 1)}
	queue := workqueue.NewTypedDelayingQueue[string]()
	go func() {
		<-ctx.Done()
		queue.ShutDown()
	}()
	configMaps := corev1.SchemeGroupVersion.WithResource("configmaps")
	sel := fields.OneTermEqualSelector("metadata.name", target).String()
	lw := &toolscache.ListWatch{
		ListFunc: func(o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = sel
			return md.Resource(configMaps).Namespace("").List(ctx, o)
		},
		WatchFunc: func(o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = sel
			return md.Resource(configMaps).Namespace("").Watch(ctx, o)
		},
	}
	enqueue := func(obj any) {
		if m, ok := obj.(*metav1.PartialObjectMetadata); ok {
			queue.Add(m.Namespace)
		}
	}
	_, informer := toolscache.NewInformerWithOptions(toolscache.InformerOptions{
		ListerWatcher: lw,
		ObjectType:    &metav1.PartialObjectMetadata{},
		Handler: toolscache.ResourceEventHandlerFuncs{
			AddFunc:    enqueue,
			UpdateFunc: func(_, obj any) { enqueue(obj) },
			DeleteFunc: func(obj any) {
				if tomb, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
					obj = tomb.Obj
				}
				enqueue(obj)
			},
		},
	})
	read := func(ns string) {
		cm, err := cs.CoreV1().ConfigMaps(ns).Get(ctx, target, metav1.GetOptions{})
		w.mu.Lock()
		switch {
		case err == nil:
			w.values[ns] = hashOf(cm.Data[osimage.ValuesKey])
		case apierrors.IsNotFound(err):
			delete(w.values, ns)
		default:
			// Read again: the watch says it changed.
			w.mu.Unlock()
			if ctx.Err() == nil {
				queue.AddAfter(ns, time.Second)
			}
			return
		}
		w.mu.Unlock()
		select {
		case w.change <- struct{}{}:
		default:
		}
	}
	for range 8 {
		go func() {
			for {
				ns, quit := queue.Get()
				if quit {
					return
				}
				read(ns)
				queue.Done(ns)
			}
		}()
	}
	go informer.RunWithContext(ctx)
	if !toolscache.WaitForCacheSync(ctx.Done(), informer.HasSynced) {
		return nil, errors.New("watching the copies: informer did not sync")
	}
	return w, nil
}

func hashOf(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}

// wait returns when every namespace of want has a copy carrying the
// values.yaml want gives it, or after timeout with how many did.
func (w *copyWatcher) wait(ctx context.Context, want map[string]string, timeout time.Duration) (int, bool) {
	hashes := make(map[string]string, len(want))
	for ns, v := range want {
		hashes[ns] = hashOf(v)
	}
	n := len(want)
	deadline := time.After(timeout)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		w.mu.Lock()
		count := 0
		for ns, h := range hashes {
			if w.values[ns] == h {
				count++
			}
		}
		w.mu.Unlock()
		if count >= n {
			return count, true
		}
		select {
		case <-w.change:
		case <-tick.C:
		case <-deadline:
			return count, false
		case <-ctx.Done():
			return count, false
		}
	}
}

// saveProfile saves kube-apiserver's heap profile (after a GC: what is
// live) as PATH.pprof, and the RSS of etcd and kube-apiserver, now and at
// their peak so far, as PATH.txt. A failure is printed, not fatal: the
// profile only explains the figures.
func saveProfile(ctx context.Context, c kubernetes.Interface, procs []*proc, path string) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "bench-propagation: profile:", err)
		return
	}
	heap, err := c.CoreV1().RESTClient().Get().AbsPath("/debug/pprof/heap").Param("gc", "1").DoRaw(ctx)
	if err == nil {
		err = os.WriteFile(path+".pprof", heap, 0o644)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench-propagation: kube-apiserver's heap profile:", err)
	}
	var b strings.Builder
	for _, p := range procs {
		fmt.Fprintf(&b, "%s rss %d MiB peak %d MiB\n", p.name, p.rss()>>20, p.hwm()>>20)
	}
	if err := os.WriteFile(path+".txt", []byte(b.String()), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "bench-propagation: profile:", err)
	}
	fmt.Fprintf(os.Stderr, "bench-propagation: %s: %s", filepath.Base(path), strings.ReplaceAll(b.String(), "\n", "; "))
	fmt.Fprintln(os.Stderr)
}
