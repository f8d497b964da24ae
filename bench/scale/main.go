// Command scale measures `osimages serve` scaled out (issues 16 and 26):
// real serve processes behind one registry, in scenarios that each give
// the registry's egress (× the layer), the time from selection to
// `available: true` and to every replica serving the image, and the
// failures of Ironic-like clients; each case runs -runs times (3) and the
// targets are judged on the medians (the worst run for egress and
// failures). The replicas' CPU time, the machine's load average and how
// busy its CPUs were are printed beside every figure. It exits 1 when a
// target is missed.
//
// Scenarios (-scenarios): orderly (1, 2, 3 replicas started one by one,
// then the selection, then 6 clients: the aggregate throughput),
// simultaneous (3 replicas started together while the catalog already
// selects the image), failover (3 replicas, the registry-pulling one
// killed with SIGKILL at half of the layer), overlap (1 and 3 replicas,
// clients from the moment every replica has read the selection, so fill
// and serving overlap) and fanout
// (1 and 5 replicas at rates where the origin's NIC cannot feed four
// followers).
//
// Replicas behave like nodes because the traffic is shaped: the benchmark
// runs in a network namespace of its own (hack/bench-scale.sh creates it,
// as root) and only that namespace's loopback is used; tc classes on it
// limit what each replica's ports send (its client and peer port, its NIC)
// and what the registry's port sends (a WAN link). Where the namespace or
// tc is refused, it says so and exits non-zero, and a run after which a
// replica's class has not sent what its clients received is refused: it
// never prints unshaped numbers.
//
// The rates keep the CPU out of the way: at the default rates every fill
// together verifies (gunzip, sha256, md5) a fraction of what two cores
// can, which the benchmark measures and prints; at the 1 Gbit/s and
// 500 Mbit/s of issue 16, three 1 GiB fills saturate two cores and the
// availability figure measures the CPU.
//
// The registry is CNCF distribution in process, behind a byte-counting TCP
// proxy on the shaped port; the apiserver is envtest (the replicas' inputs
// and output ConfigMaps, the publisher's Lease, and one EndpointSlice per
// replica that the benchmark writes itself: envtest runs no endpointslice
// controller).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sylva-projects/osimages/internal/devregistry"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/testenv"
)

const (
	mib = 1 << 20
	gib = 1 << 30
	// The kubeconfig's namespace as well as the objects': a replica that
	// takes its namespace from either finds its Lease and EndpointSlices.
	namespace = metav1.NamespaceDefault
	imageKey  = "bench-image"
	headless  = "osimages-server-headless"
	lease     = "osimages-server-publisher"
	// Fixed ports: the namespace is the benchmark's own, and tc matches them.
	registryPort = 15000
	clientPort   = 18080 // + replica index
	peerPort     = 19080 // + replica index
	// loAddress is the address hack/bench-scale.sh puts on the namespace's
	// lo besides 127.0.0.1. EndpointSlices refuse loopback addresses, so
	// they list the replicas at this one; it is on lo all the same.
	loAddress = "192.0.2.1"
	// maxReplicas bounds the replica counts (the ports above).
	maxReplicas = 9
	// fanoutReplicas is the fanout scenario's count: four followers.
	fanoutReplicas = 5
)

type options struct {
	size        int64
	clients     int
	counts      []int
	scenarios   []string
	runs        int
	rates       rates
	fanoutRate  string
	binary      string
	dir         string
	keepLogs    bool
	timeout     time.Duration
	maxCPUShare float64
	listLag     time.Duration
}

func main() {
	var o options
	var counts, scenarios string
	flag.Int64Var(&o.size, "size", 512*mib, "image size in bytes (a multiple of 1 MiB); one MiB in four random, like a disk image, so its gzip layer is about a quarter of it")
	flag.IntVar(&o.clients, "clients", 6, "concurrent Ironic-like clients (orderly and overlap), spread round-robin over the replicas")
	flag.StringVar(&counts, "replicas", "1,2,3", "replica counts of the orderly scenario, in order; the first must be 1 (the baseline)")
	flag.StringVar(&scenarios, "scenarios", strings.Join(allScenarios, ","), "scenarios to run, separated by commas: "+strings.Join(allScenarios, ", "))
	flag.IntVar(&o.runs, "runs", 3, "runs of each case; the targets are judged on the medians (on the worst run for registry egress and client failures)")
	flag.StringVar(&o.rates.replica, "replica-rate", "400mbit", "tc rate of each replica's ports (its NIC)")
	flag.StringVar(&o.rates.registry, "registry-rate", "64mbit", "tc rate of the registry's port (a WAN link)")
	flag.StringVar(&o.fanoutRate, "fanout-replica-rate", "", "tc rate of each replica's ports in the fanout scenario (default: twice -registry-rate, so that the origin's NIC feeds two followers at the registry's pace, not four)")
	flag.StringVar(&o.binary, "osimages", "bin/osimages", "osimages binary")
	flag.StringVar(&o.dir, "dir", "", "work directory (default: a new one under $TMPDIR, removed at the end); needs size/4 + 5 x size of disk")
	flag.BoolVar(&o.keepLogs, "keep-logs", false, "keep the work directory with the replicas' logs (their images are removed)")
	flag.DurationVar(&o.timeout, "timeout", 10*time.Minute, "bound on one run (fill and downloads)")
	flag.DurationVar(&o.listLag, "list-lag", time.Second, "simultaneous scenario: how long after a replica listens its endpoint is listed (not ready), as a pod's is once it has an address and the endpointslice controller has seen it")
	flag.Float64Var(&o.maxCPUShare, "max-cpu-share", 0.5, "the fills' verification may take at most this share of the machine's CPUs at the chosen rates (a target: above it the availability figures measure the CPU, not the protocol)")
	flag.Parse()
	fail := func(format string, a ...any) {
		fmt.Fprintf(os.Stderr, "bench-scale: "+format+"\n", a...)
		os.Exit(2)
	}
	for _, c := range strings.Split(counts, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(c))
		if err != nil || n < 1 || n > maxReplicas {
			fail("-replicas %q: want counts from 1 to %d separated by commas, such as 1,2,3", counts, maxReplicas)
		}
		o.counts = append(o.counts, n)
	}
	if o.counts[0] != 1 {
		fail("-replicas must start with 1: the ratios are against one replica")
	}
	for _, s := range strings.Split(scenarios, ",") {
		s = strings.TrimSpace(s)
		if !slices.Contains(allScenarios, s) {
			fail("-scenarios %q: %q is not a scenario; choose among %s", scenarios, s, strings.Join(allScenarios, ", "))
		}
		if !slices.Contains(o.scenarios, s) {
			o.scenarios = append(o.scenarios, s)
		}
	}
	if o.runs < 1 {
		fail("-runs %d: want at least 1", o.runs)
	}
	if o.size <= 0 || o.size%mib != 0 || o.clients < 1 {
		fail("-size must be a positive multiple of 1 MiB and -clients at least 1")
	}
	reg, err := parseRate(o.rates.registry)
	if err != nil {
		fail("-registry-rate: %v", err)
	}
	if _, err := parseRate(o.rates.replica); err != nil {
		fail("-replica-rate: %v", err)
	}
	if o.fanoutRate == "" {
		o.fanoutRate = fmt.Sprintf("%gmbit", 2*reg/1e6)
	} else if _, err := parseRate(o.fanoutRate); err != nil {
		fail("-fanout-replica-rate: %v", err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	missed, err := run(ctx, o)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench-scale:", err)
		os.Exit(1)
	}
	if missed > 0 {
		fmt.Fprintf(os.Stderr, "bench-scale: %d target(s) NOT met\n", missed)
		os.Exit(1)
	}
}

// plan is the cases to run, in order: each scenario's cases, the baseline
// of one replica first.
func plan(o options) [][]spec {
	fanout := rates{replica: o.fanoutRate, registry: o.rates.registry}
	var out [][]spec
	needBaseline := slices.ContainsFunc(o.scenarios, func(s string) bool {
		return s == scenarioOrderly || s == scenarioSimultaneous || s == scenarioFailover
	})
	if needBaseline && !slices.Contains(o.scenarios, scenarioOrderly) {
		out = append(out, []spec{{scenarioOrderly, 1, o.rates, o.clients}})
	}
	for _, s := range o.scenarios {
		var cases []spec
		switch s {
		case scenarioOrderly:
			for _, n := range o.counts {
				cases = append(cases, spec{s, n, o.rates, o.clients})
			}
		case scenarioSimultaneous, scenarioFailover:
			cases = []spec{{s, 3, o.rates, 0}}
		case scenarioOverlap:
			cases = []spec{{s, 1, o.rates, o.clients}, {s, 3, o.rates, o.clients}}
		case scenarioFanout:
			cases = []spec{{s, 1, fanout, 0}, {s, fanoutReplicas, fanout, 0}}
		}
		out = append(out, cases)
	}
	return out
}

func run(ctx context.Context, o options) (int, error) {
	if err := ownNetworkNamespace(); err != nil {
		return 0, err
	}
	bin, err := exec.LookPath(o.binary)
	if err != nil {
		return 0, fmt.Errorf("%s not found: run hack/bench-scale.sh, which builds it", o.binary)
	}
	if o.binary, err = filepath.Abs(bin); err != nil {
		return 0, err
	}
	peers := supportsPeers(o.binary)
	cases := plan(o)
	most := 0
	for _, cs := range cases {
		for _, c := range cs {
			most = max(most, c.replicas)
		}
	}
	if err := shape(o.rates, most); err != nil {
		return 0, fmt.Errorf("shaping the loopback with tc: %w\nthe benchmark does not run unshaped: it needs root, iproute2's tc and the sch_htb and cls_u32 kernel modules", err)
	}
	defer exec.Command("tc", "qdisc", "del", "dev", "lo", "root").Run()

	dir := o.dir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "bench-scale-"); err != nil {
			return 0, err
		}
	}
	if o.keepLogs {
		fmt.Fprintf(os.Stderr, "bench-scale: logs in %s\n", dir)
	} else {
		defer os.RemoveAll(dir)
	}

	fmt.Printf("scale benchmark: a %s image (one MiB in four random) served by `osimages serve` replicas; scenarios %s, %d run(s) each\n",
		human(o.size), strings.Join(o.scenarios, ", "), o.runs)
	fmt.Printf("  network namespace of its own, loopback only; tc htb: %s (fanout: each replica's ports %s)\n", o.rates, o.fanoutRate)
	fmt.Printf("  machine: %d CPUs, load average %.2f at the start\n", runtime.NumCPU(), load1())
	if peers {
		fmt.Println("  this osimages has --peers-service: replicas find each other through EndpointSlices and fill from each other")
	} else {
		fmt.Println("  this osimages has no --peers-service yet: each replica pulls from the registry on its own, and each writes the output")
	}

	// The image, published as a gzip layer to a registry on disk.
	start := time.Now()
	reg, pub, err := publish(ctx, dir, o.size)
	if err != nil {
		return 0, err
	}
	defer reg.Close()
	blobSize, _ := strconv.ParseInt(pub.Fields.Get(osimage.FieldArchiveSize), 10, 64)
	sha, err := osimage.ParseSHA256(pub.Fields.Get(osimage.FieldSHA256))
	if err != nil {
		return 0, err
	}
	fmt.Printf("  image: sha256 %s, layer %s (gzip), published in %.1f s\n", sha[:16], human(blobSize), time.Since(start).Seconds())

	proxy, err := startCountingProxy(fmt.Sprintf("127.0.0.1:%d", registryPort), reg.Host)
	if err != nil {
		return 0, err
	}
	defer proxy.Close()
	if err := checkShaping(ctx, o.rates, reg.Host, pub, blobSize); err != nil {
		return 0, err
	}
	cost, err := verifyCost(ctx, fmt.Sprintf("http://%s/v2/%s/blobs/%s", reg.Host, pub.Repository, pub.LayerDigest), o.size)
	if err != nil {
		return 0, fmt.Errorf("measuring the verification's CPU cost: %w", err)
	}
	budget := cpuBudget(o, cost, blobSize)

	fmt.Fprintln(os.Stderr, "bench-scale: starting envtest")
	k, err := testenv.StartKube()
	if err != nil {
		return 0, err
	}
	defer k.Stop()
	if err := setupKube(ctx, k.Client); err != nil {
		return 0, err
	}

	// The catalog names the image through the proxy: every registry byte
	// the replicas get is counted and shaped.
	fields := pub.Fields.Clone()
	fields[osimage.FieldURI] = fmt.Sprintf("oci://127.0.0.1:%d/%s", registryPort, strings.TrimPrefix(pub.Ref, reg.Host+"/"))
	info, err := osimage.MarshalInfo(osimage.Catalog{imageKey: fields})
	if err != nil {
		return 0, err
	}
	values := filepath.Join(dir, "mgmt-values.yaml")
	if err := os.WriteFile(values, []byte("name: mgmt\noci_registry_insecure: true\nos_image_server_additional_selectors:\n  all: {_os_images_key_: "+imageKey+"}\n"), 0o600); err != nil {
		return 0, err
	}
	e := &env{o: o, k: k, dir: dir, values: values, info: string(info), proxy: proxy, peers: peers, blobSize: blobSize,
		img: image{sha: sha, filename: pub.Fields.Get(osimage.FieldFilename), size: o.size}}

	results := map[spec][]runResult{}
	shapedFor := o.rates
	for _, cs := range cases {
		if r := cs[0].rates; r != shapedFor {
			if err := shape(r, most); err != nil {
				return 0, fmt.Errorf("shaping the loopback with tc: %w", err)
			}
			shapedFor = r
		}
		// Runs interleave the counts, so that a change of the machine's
		// load weighs on every count alike.
		for round := 1; round <= o.runs; round++ {
			for _, c := range cs {
				rctx, cancel := context.WithTimeout(ctx, o.timeout)
				r, err := e.runOne(rctx, c, round)
				cancel()
				if ctx.Err() != nil {
					return 0, errors.New("interrupted; replicas stopped")
				}
				if err != nil {
					return 0, fmt.Errorf("%s, run %d: %w", c, round, err)
				}
				results[c] = append(results[c], r)
			}
		}
	}
	return report(o, cases, results, blobSize, peers, budget), nil
}

type image struct {
	sha      osimage.SHA256
	filename string
	size     int64
}

func (i image) path() string { return "/images/" + i.sha.String() + "/" + i.filename }

// supportsPeers tells whether serve has the scale-out flags.
func supportsPeers(binary string) bool {
	out, _ := exec.Command(binary, "serve", "--help").CombinedOutput()
	return strings.Contains(string(out), "--peers-service")
}

func publish(ctx context.Context, dir string, size int64) (*devregistry.Registry, devregistry.Published, error) {
	file := filepath.Join(dir, "bench-image.raw")
	f, err := os.Create(file)
	if err != nil {
		return nil, devregistry.Published{}, err
	}
	err = devregistry.WriteDiskContent(f, size, 42)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, devregistry.Published{}, err
	}
	defer os.Remove(file)
	reg, err := devregistry.Start(ctx, devregistry.Options{RootDirectory: filepath.Join(dir, "registry")})
	if err != nil {
		return nil, devregistry.Published{}, err
	}
	pub, err := reg.Publish(ctx, devregistry.DiskImage{
		Repository: "sylva-projects/dib/bench-image", Tag: "1.0", ContentFile: file, Gzip: true,
	})
	if err != nil {
		reg.Close()
		return nil, devregistry.Published{}, err
	}
	return reg, pub, nil
}

func human(n int64) string {
	switch {
	case n >= gib && n%gib == 0:
		return fmt.Sprintf("%d GiB", n/gib)
	case n >= 10*mib:
		return fmt.Sprintf("%.0f MiB", float64(n)/mib)
	default:
		return fmt.Sprintf("%.1f MiB", float64(n)/mib)
	}
}
