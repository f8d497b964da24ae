// Command scale measures `osimages serve` scaled out (issue 16): with 1, 2
// and 3 replicas, real serve processes behind one registry, it prints the
// aggregate throughput of 12 concurrent clients spread round-robin over the
// replicas and its ratio to 1 replica, the bytes the registry sent for each
// replica count, and the time from selection to `available: true` at 3
// replicas against a single replica pulling alone.
//
// Replicas behave like nodes because the traffic is shaped: the benchmark
// runs in a network namespace of its own (hack/bench-scale.sh creates it,
// as root) and only that namespace's loopback is used; tc classes on it
// limit what each replica's ports send (its client and peer port, its NIC)
// to -replica-rate and what the registry's port sends (a WAN link) to
// -registry-rate. Where the namespace or tc is refused, it says so and
// exits non-zero: it never prints unshaped numbers.
//
// The registry is CNCF distribution in process, behind a byte-counting TCP
// proxy on the shaped port; the apiserver is envtest (the replicas' inputs
// and output ConfigMaps, the publisher's Lease, and one EndpointSlice per
// replica that the benchmark writes itself: envtest runs no endpointslice
// controller).
package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/sylva-projects/osimages/bench/internal/proc"
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
)

// Targets of the issue.
const (
	ratioAt2Target    = 1.8
	ratioAt3Target    = 2.6
	registryTarget    = 1.05
	availabilityRatio = 1.3
)

type options struct {
	size         int64
	clients      int
	counts       []int
	replicaRate  string
	registryRate string
	binary       string
	dir          string
	keepLogs     bool
	timeout      time.Duration
}

func main() {
	var o options
	var counts string
	flag.Int64Var(&o.size, "size", gib, "image size in bytes (a multiple of 1 MiB); one MiB in four random, like a disk image")
	flag.IntVar(&o.clients, "clients", 12, "concurrent client downloads, spread round-robin over the replicas")
	flag.StringVar(&counts, "replicas", "1,2,3", "replica counts to measure, in order; the first must be 1 (the baseline)")
	flag.StringVar(&o.replicaRate, "replica-rate", "1gbit", "tc rate of each replica's ports (its NIC)")
	flag.StringVar(&o.registryRate, "registry-rate", "500mbit", "tc rate of the registry's port (a WAN link)")
	flag.StringVar(&o.binary, "osimages", "bin/osimages", "osimages binary")
	flag.StringVar(&o.dir, "dir", "", "work directory (default: a new one under $TMPDIR, removed at the end); needs size/4 + replicas x size of disk")
	flag.BoolVar(&o.keepLogs, "keep-logs", false, "keep the work directory with the replicas' logs (their images are removed)")
	flag.DurationVar(&o.timeout, "timeout", 20*time.Minute, "bound on one replica count's fill and downloads")
	flag.Parse()
	for _, c := range strings.Split(counts, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(c))
		if err != nil || n < 1 || n > 9 {
			fmt.Fprintf(os.Stderr, "bench-scale: -replicas %q: want counts from 1 to 9 separated by commas, such as 1,2,3\n", counts)
			os.Exit(2)
		}
		o.counts = append(o.counts, n)
	}
	if o.counts[0] != 1 {
		fmt.Fprintln(os.Stderr, "bench-scale: -replicas must start with 1: the ratios are against one replica")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, o)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench-scale:", err)
		os.Exit(1)
	}
}

// result is what one replica count measured.
type result struct {
	replicas      int
	selectToAvail time.Duration // selection -> available: true in the output
	selectToAll   time.Duration // selection -> every replica serves the image
	registryBytes int64
	wall          time.Duration // the clients' downloads
	aggregate     float64       // bytes per second, all clients
	perReplica    []float64     // bytes per second served by each replica
}

func run(ctx context.Context, o options) error {
	if o.size <= 0 || o.size%mib != 0 || o.clients < 1 {
		return errors.New("-size must be a positive multiple of 1 MiB and -clients at least 1")
	}
	if err := ownNetworkNamespace(); err != nil {
		return err
	}
	bin, err := exec.LookPath(o.binary)
	if err != nil {
		return fmt.Errorf("%s not found: run hack/bench-scale.sh, which builds it", o.binary)
	}
	if o.binary, err = filepath.Abs(bin); err != nil {
		return err
	}
	peers := supportsPeers(o.binary)

	if err := shape(o, slices.Max(o.counts)); err != nil {
		return fmt.Errorf("shaping the loopback with tc: %w\nthe benchmark does not run unshaped: it needs root, iproute2's tc and the sch_htb and cls_u32 kernel modules", err)
	}
	defer exec.Command("tc", "qdisc", "del", "dev", "lo", "root").Run()

	dir := o.dir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "bench-scale-"); err != nil {
			return err
		}
	}
	if o.keepLogs {
		fmt.Fprintf(os.Stderr, "bench-scale: logs in %s\n", dir)
	} else {
		defer os.RemoveAll(dir)
	}

	fmt.Printf("scale benchmark: %d clients download a %s image (one MiB in four random) from 1..%d `osimages serve` replicas\n",
		o.clients, human(o.size), slices.Max(o.counts))
	fmt.Printf("  network namespace of its own, loopback only; tc htb: each replica's ports %s, the registry's port %s\n", o.replicaRate, o.registryRate)
	if peers {
		fmt.Println("  this osimages has --peers-service: replicas find each other through EndpointSlices and fill from each other")
	} else {
		fmt.Println("  this osimages has no --peers-service yet: each replica pulls from the registry on its own, and each writes the output")
	}

	// The image, published as a gzip layer to a registry on disk.
	start := time.Now()
	reg, pub, err := publish(ctx, dir, o.size)
	if err != nil {
		return err
	}
	defer reg.Close()
	blobSize, _ := strconv.ParseInt(pub.Fields.Get(osimage.FieldArchiveSize), 10, 64)
	sha, err := osimage.ParseSHA256(pub.Fields.Get(osimage.FieldSHA256))
	if err != nil {
		return err
	}
	fmt.Printf("  image: sha256 %s, layer %s (gzip), published in %.1f s\n", sha[:16], human(blobSize), time.Since(start).Seconds())

	proxy, err := startCountingProxy(fmt.Sprintf("127.0.0.1:%d", registryPort), reg.Host)
	if err != nil {
		return err
	}
	defer proxy.Close()
	if err := checkShaping(ctx, o, reg.Host, pub, blobSize); err != nil {
		return err
	}

	fmt.Fprintln(os.Stderr, "bench-scale: starting envtest")
	k, err := testenv.StartKube()
	if err != nil {
		return err
	}
	defer k.Stop()
	if err := setupKube(ctx, k.Client); err != nil {
		return err
	}

	// The catalog names the image through the proxy: every registry byte
	// the replicas get is counted and shaped.
	fields := pub.Fields.Clone()
	fields[osimage.FieldURI] = fmt.Sprintf("oci://127.0.0.1:%d/%s", registryPort, strings.TrimPrefix(pub.Ref, reg.Host+"/"))
	info, err := osimage.MarshalInfo(osimage.Catalog{imageKey: fields})
	if err != nil {
		return err
	}
	values := filepath.Join(dir, "mgmt-values.yaml")
	if err := os.WriteFile(values, []byte("name: mgmt\noci_registry_insecure: true\nos_image_server_additional_selectors:\n  all: {_os_images_key_: "+imageKey+"}\n"), 0o600); err != nil {
		return err
	}
	img := image{sha: sha, filename: pub.Fields.Get(osimage.FieldFilename), size: o.size}

	var results []result
	for _, n := range o.counts {
		rctx, cancel := context.WithTimeout(ctx, o.timeout)
		r, err := measure(rctx, o, k, dir, values, string(info), img, proxy, n, peers)
		cancel()
		if ctx.Err() != nil {
			return errors.New("interrupted; replicas stopped")
		}
		if err != nil {
			return fmt.Errorf("%d replicas: %w", n, err)
		}
		results = append(results, r)
	}
	report(o, results, blobSize, peers)
	return nil
}

type image struct {
	sha      osimage.SHA256
	filename string
	size     int64
}

func (i image) path() string { return "/images/" + i.sha.String() + "/" + i.filename }

// ownNetworkNamespace refuses to run in a network namespace shared with
// anything else: the fixed ports and the tc qdisc on lo must not touch anyone
// else's traffic. hack/bench-scale.sh runs it through `ip netns exec` in a
// namespace it has just made: its parent is outside it, and lo is its only
// interface.
func ownNetworkNamespace() error {
	const how = "run hack/bench-scale.sh (as root), which runs the benchmark in a network namespace of its own (ip netns add); it shapes the loopback with tc and never runs in a shared one"
	self, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		return fmt.Errorf("reading the network namespace: %w", err)
	}
	parent, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", os.Getppid()))
	if err != nil {
		return fmt.Errorf("reading the parent's network namespace (%w): %s", err, how)
	}
	if self == parent {
		return errors.New("not in a network namespace of its own: " + how)
	}
	ifaces, err := net.Interfaces()
	if err != nil {
		return err
	}
	for _, i := range ifaces {
		if i.Name != "lo" {
			return fmt.Errorf("the network namespace has an interface %s besides lo: %s", i.Name, how)
		}
		addrs, err := i.Addrs()
		if err != nil {
			return err
		}
		if !slices.ContainsFunc(addrs, func(a net.Addr) bool { return strings.HasPrefix(a.String(), loAddress+"/") }) {
			return fmt.Errorf("lo has no address %s for the EndpointSlices (they refuse 127.0.0.0/8): %s", loAddress, how)
		}
	}
	return nil
}

// supportsPeers tells whether serve has the scale-out flags.
func supportsPeers(binary string) bool {
	out, _ := exec.Command(binary, "serve", "--help").CombinedOutput()
	return strings.Contains(string(out), "--peers-service")
}

// shape puts an htb qdisc on lo: one class per replica (its client and peer
// ports, as a source port: what the replica sends) and one for the
// registry's port. Everything else (the apiserver, requests, ACKs) is not
// classified and goes unshaped.
func shape(o options, replicas int) error {
	tc := func(args ...string) error {
		out, err := exec.Command("tc", args...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("tc %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
		}
		return nil
	}
	_ = exec.Command("tc", "qdisc", "del", "dev", "lo", "root").Run()
	if err := tc("qdisc", "add", "dev", "lo", "root", "handle", "1:", "htb", "default", "0"); err != nil {
		return err
	}
	// lo's MTU is 64 KiB: the burst and quantum must hold a whole packet.
	class := func(id, rate string, sports ...int) error {
		if err := tc("class", "add", "dev", "lo", "parent", "1:", "classid", "1:"+id, "htb",
			"rate", rate, "ceil", rate, "burst", "256k", "cburst", "256k", "quantum", "65536"); err != nil {
			return err
		}
		for _, p := range sports {
			if err := tc("filter", "add", "dev", "lo", "parent", "1:", "protocol", "ip", "prio", "1", "u32",
				"match", "ip", "sport", strconv.Itoa(p), "0xffff", "flowid", "1:"+id); err != nil {
				return err
			}
		}
		return nil
	}
	if err := class("50", o.registryRate, registryPort); err != nil {
		return err
	}
	for i := range replicas {
		if err := class(strconv.Itoa(10+i), o.replicaRate, clientPort+i, peerPort+i); err != nil {
			return err
		}
	}
	return nil
}

// checkShaping downloads the blob once through the shaped proxy and once
// from the registry's own port, unshaped, and refuses to go on when the
// shaped rate is not near -registry-rate.
func checkShaping(ctx context.Context, o options, regHost string, pub devregistry.Published, blobSize int64) error {
	blob := fmt.Sprintf("/v2/%s/blobs/%s", pub.Repository, pub.LayerDigest)
	rate := func(host string) (float64, error) {
		t0 := time.Now()
		n, _, err := download(ctx, "http://"+host+blob)
		if err != nil {
			return 0, err
		}
		if n != blobSize {
			return 0, fmt.Errorf("got %d bytes of the blob, want %d", n, blobSize)
		}
		return float64(n) * 8 / time.Since(t0).Seconds(), nil
	}
	shaped, err := rate(fmt.Sprintf("127.0.0.1:%d", registryPort))
	if err != nil {
		return fmt.Errorf("shaped download of the registry port: %w", err)
	}
	unshaped, err := rate(regHost)
	if err != nil {
		return fmt.Errorf("unshaped download of the registry: %w", err)
	}
	want, err := parseRate(o.registryRate)
	if err != nil {
		return err
	}
	fmt.Printf("  shaping check, one download of the layer: registry port %.0f Mbit/s (tc rate %s), the registry's own unshaped port %.0f Mbit/s\n",
		shaped/1e6, o.registryRate, unshaped/1e6)
	if shaped > 1.15*want || shaped < 0.5*want {
		return fmt.Errorf("the shaped download ran at %.0f Mbit/s, not near %s: tc does not shape this loopback as it should; no unshaped numbers are printed", shaped/1e6, o.registryRate)
	}
	return nil
}

// parseRate reads tc rates of the forms used here: 500mbit, 1gbit, 100kbit.
func parseRate(s string) (float64, error) {
	units := []struct {
		suffix string
		mult   float64
	}{{"gbit", 1e9}, {"mbit", 1e6}, {"kbit", 1e3}, {"bit", 1}}
	for _, u := range units {
		if v, ok := strings.CutSuffix(strings.ToLower(s), u.suffix); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err == nil && f > 0 {
				return f * u.mult, nil
			}
		}
	}
	return 0, fmt.Errorf("rate %q: want a number and gbit, mbit or kbit, such as 500mbit", s)
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

// countingProxy forwards TCP connections to the registry and counts the
// bytes the registry sends.
type countingProxy struct {
	ln   net.Listener
	sent atomic.Int64
}

func startCountingProxy(addr, upstream string) (*countingProxy, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("the registry proxy's port: %w", err)
	}
	p := &countingProxy{ln: ln}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.serve(c, upstream)
		}
	}()
	return p, nil
}

func (p *countingProxy) serve(c net.Conn, upstream string) {
	defer c.Close()
	u, err := net.Dial("tcp", upstream)
	if err != nil {
		return
	}
	defer u.Close()
	done := make(chan struct{})
	go func() {
		io.Copy(u, c)
		u.(*net.TCPConn).CloseWrite()
		close(done)
	}()
	// Counted as it goes: the replicas keep their registry connections
	// open between requests.
	io.Copy(countingWriter{c, &p.sent}, u)
	c.(*net.TCPConn).CloseWrite()
	<-done
}

type countingWriter struct {
	w io.Writer
	n *atomic.Int64
}

func (c countingWriter) Write(b []byte) (int, error) {
	n, err := c.w.Write(b)
	c.n.Add(int64(n))
	return n, err
}

func (p *countingProxy) Close() error { return p.ln.Close() }

func setupKube(ctx context.Context, cs kubernetes.Interface) error {
	_, err := cs.CoreV1().Services(namespace).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: headless},
		Spec: corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone, Selector: map[string]string{"app.kubernetes.io/component": "server"},
			Ports: []corev1.ServicePort{{Name: "http", Port: 8080}, {Name: "peer", Port: 8081}}},
	}, metav1.CreateOptions{})
	return err
}

// replica is one serve process.
type replica struct {
	id      string
	index   int
	logPath string
	*proc.Process
	served    atomic.Int64
	clientURL string
}

func startReplica(o options, k *testenv.Kube, dir, values string, i int, peers bool) (*replica, error) {
	r := &replica{id: fmt.Sprintf("osimages-server-%d", i), index: i,
		clientURL: fmt.Sprintf("http://127.0.0.1:%d", clientPort+i)}
	data := filepath.Join(dir, r.id)
	if err := os.MkdirAll(data, 0o755); err != nil {
		return nil, err
	}
	// Listening on every address of the namespace is listening on lo:
	// clients use 127.0.0.1, peers the EndpointSlices' loAddress.
	args := []string{"serve", "--data", data, "--listen", fmt.Sprintf(":%d", clientPort+i),
		"--os-images-configmap", namespace + "/" + osimage.InfoConfigMapName, "-f", values,
		"--output-configmap", namespace + "/" + osimage.ServedConfigMapName,
		"--kubeconfig", k.Kubeconfig, "--keep-referenced=false", "--concurrency", "1"}
	if peers {
		args = append(args, "--replica-id", r.id, "--peers-service", headless,
			"--peer-listen", fmt.Sprintf(":%d", peerPort+i), "--publisher-lease", lease)
	}
	r.logPath = filepath.Join(dir, r.id+".log")
	log, err := os.OpenFile(r.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer log.Close()
	cmd := exec.Command(o.binary, args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.Env = append(os.Environ(), "POD_NAME="+r.id, "POD_NAMESPACE="+namespace, "DOCKER_CONFIG="+dir)
	if r.Process, err = proc.Start(cmd); err != nil {
		return nil, err
	}
	return r, nil
}

func (r *replica) stop() { r.Stop(15 * time.Second) }

func (r *replica) logTail() string {
	data, _ := os.ReadFile(r.logPath)
	if len(data) > 3000 {
		data = data[len(data)-3000:]
	}
	return string(data)
}

// status is the HTTP status of a HEAD of url, or 0.
func status(ctx context.Context, url string) int {
	req, _ := http.NewRequestWithContext(ctx, http.MethodHead, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// poll calls cond every 50 ms until it holds, the context ends, or a
// replica exits.
func poll(ctx context.Context, what string, replicas []*replica, cond func() (bool, string)) error {
	last := ""
	for {
		ok, state := cond()
		if ok {
			return nil
		}
		last = state
		for _, r := range replicas {
			select {
			case <-r.Done():
				return fmt.Errorf("%s exited while waiting for %s:\n%s", r.id, what, r.logTail())
			default:
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w (last: %s)", what, ctx.Err(), last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// reset leaves the apiserver as a fresh install would: the catalog exists
// without data (the replicas wait for it), no output, no Lease, no
// EndpointSlice.
func reset(ctx context.Context, cs kubernetes.Interface) error {
	cms := cs.CoreV1().ConfigMaps(namespace)
	for _, name := range []string{osimage.InfoConfigMapName, osimage.ServedConfigMapName} {
		if err := cms.Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	}
	if err := cs.CoordinationV1().Leases(namespace).Delete(ctx, lease, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	if err := cs.DiscoveryV1().EndpointSlices(namespace).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + headless}); err != nil {
		return err
	}
	_, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: osimage.InfoConfigMapName}}, metav1.CreateOptions{})
	return err
}

// endpointSlice lists replica r as a ready endpoint of the headless
// Service, with its own ports (the replicas share lo's addresses), as the
// endpointslice controller would once its pod is ready.
func endpointSlice(r *replica) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: headless + "-" + strconv.Itoa(r.index), Labels: map[string]string{discoveryv1.LabelServiceName: headless}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{
			Addresses:  []string{loAddress},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
			Hostname:   ptr.To(r.id),
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: namespace, Name: r.id},
		}},
		Ports: []discoveryv1.EndpointPort{
			{Name: ptr.To("http"), Port: ptr.To(int32(clientPort + r.index)), Protocol: ptr.To(corev1.ProtocolTCP)},
			{Name: ptr.To("peer"), Port: ptr.To(int32(peerPort + r.index)), Protocol: ptr.To(corev1.ProtocolTCP)},
		},
	}
}

func measure(ctx context.Context, o options, k *testenv.Kube, dir, values, info string, img image, proxy *countingProxy, n int, peers bool) (result, error) {
	res := result{replicas: n}
	fmt.Fprintf(os.Stderr, "bench-scale: %d replica(s)\n", n)
	if err := reset(ctx, k.Client); err != nil {
		return res, err
	}
	round := filepath.Join(dir, fmt.Sprintf("replicas-%d", n))
	var replicas []*replica
	defer func() {
		var wg sync.WaitGroup
		for _, r := range replicas {
			wg.Go(r.stop)
		}
		wg.Wait()
		// The images go; with -keep-logs the logs stay.
		for _, r := range replicas {
			os.RemoveAll(filepath.Join(round, r.id))
		}
		if !o.keepLogs {
			os.RemoveAll(round)
		}
	}()
	for i := range n {
		r, err := startReplica(o, k, round, values, i, peers)
		if err != nil {
			return res, err
		}
		replicas = append(replicas, r)
	}
	for _, r := range replicas {
		if err := poll(ctx, r.id+" ready", replicas, func() (bool, string) {
			code := status(ctx, r.clientURL+"/readyz")
			return code == http.StatusOK, fmt.Sprint(code)
		}); err != nil {
			return res, err
		}
		if _, err := k.Client.DiscoveryV1().EndpointSlices(namespace).Create(ctx, endpointSlice(r), metav1.CreateOptions{}); err != nil {
			return res, err
		}
	}

	// Selection: the catalog arrives with the image that the values select.
	before := proxy.sent.Load()
	t0 := time.Now()
	if _, err := k.Client.CoreV1().ConfigMaps(namespace).Update(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: osimage.InfoConfigMapName},
		Data:       map[string]string{osimage.ValuesKey: info},
	}, metav1.UpdateOptions{}); err != nil {
		return res, err
	}
	serving := make([]bool, n)
	err := poll(ctx, "available: true and every replica serving the image", replicas, func() (bool, string) {
		if res.selectToAvail == 0 {
			cm, err := k.Client.CoreV1().ConfigMaps(namespace).Get(ctx, osimage.ServedConfigMapName, metav1.GetOptions{})
			if err == nil {
				if served, err := osimage.ParseServed([]byte(cm.Data[osimage.ValuesKey])); err == nil && served[img.sha].Available {
					res.selectToAvail = time.Since(t0)
				}
			}
		}
		all := true
		for i, r := range replicas {
			if !serving[i] {
				serving[i] = status(ctx, r.clientURL+img.path()) == http.StatusOK
			}
			all = all && serving[i]
		}
		if all && res.selectToAll == 0 {
			res.selectToAll = time.Since(t0)
		}
		return res.selectToAvail > 0 && all, fmt.Sprintf("available after %s, serving %v", res.selectToAvail, serving)
	})
	if err != nil {
		return res, err
	}
	// Resumes and retries may still be closing: let the registry's
	// connections drain before counting.
	time.Sleep(500 * time.Millisecond)
	res.registryBytes = proxy.sent.Load() - before

	// The clients, round-robin over the replicas.
	var wg sync.WaitGroup
	errs := make([]error, o.clients)
	t1 := time.Now()
	for c := range o.clients {
		r := replicas[c%n]
		wg.Go(func() {
			got, sum, err := download(ctx, r.clientURL+img.path())
			r.served.Add(got)
			switch {
			case err != nil:
				errs[c] = fmt.Errorf("client %d from %s: %w", c, r.id, err)
			case got != img.size || sum != img.sha.String():
				errs[c] = fmt.Errorf("client %d from %s: %d bytes of sha256 %s, want %d of %s", c, r.id, got, sum, img.size, img.sha)
			}
		})
	}
	wg.Wait()
	res.wall = time.Since(t1)
	if err := errors.Join(errs...); err != nil {
		return res, err
	}
	res.aggregate = float64(o.clients) * float64(img.size) / res.wall.Seconds()
	for _, r := range replicas {
		res.perReplica = append(res.perReplica, float64(r.served.Load())/res.wall.Seconds())
	}
	fmt.Fprintf(os.Stderr, "bench-scale: %d replica(s): available %.1f s, all serving %.1f s, registry %s, clients %.1f s\n",
		n, res.selectToAvail.Seconds(), res.selectToAll.Seconds(), human(res.registryBytes), res.wall.Seconds())
	return res, nil
}

// download reads url to the end and returns its length and sha256.
func download(ctx context.Context, url string) (int64, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, "", fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	h := sha256.New()
	n, err := io.Copy(h, resp.Body)
	return n, hex.EncodeToString(h.Sum(nil)), err
}

func report(o options, results []result, blobSize int64, peers bool) {
	base := results[0]
	fmt.Println()
	fmt.Printf("  %-8s %12s %8s %22s %13s %16s %18s\n", "replicas", "aggregate", "ratio", "per replica MiB/s", "registry", "registry/blob", "select->available")
	for _, r := range results {
		var per []string
		for _, p := range r.perReplica {
			per = append(per, fmt.Sprintf("%.0f", p/mib))
		}
		fmt.Printf("  %-8d %7.1f MiB/s %7.2fx %22s %13s %15.2fx %16.1f s\n", r.replicas, r.aggregate/mib, r.aggregate/base.aggregate,
			strings.Join(per, " "), human(r.registryBytes), float64(r.registryBytes)/float64(blobSize), r.selectToAvail.Seconds())
	}
	fmt.Println()
	for _, r := range results {
		ratio := r.aggregate / base.aggregate
		switch r.replicas {
		case 2:
			fmt.Printf("  throughput at 2 replicas: %.2fx one replica (target >= %.1fx: %s)\n", ratio, ratioAt2Target, verdict(ratio >= ratioAt2Target))
		case 3:
			fmt.Printf("  throughput at 3 replicas: %.2fx one replica (target >= %.1fx: %s)\n", ratio, ratioAt3Target, verdict(ratio >= ratioAt3Target))
		}
	}
	worst := 0.0
	for _, r := range results {
		worst = max(worst, float64(r.registryBytes)/float64(blobSize))
	}
	fmt.Printf("  registry bytes: at most %.2fx the %s blob at any count (target <= %.2fx: %s)\n", worst, human(blobSize), registryTarget, verdict(worst <= registryTarget))
	for _, r := range results {
		if r.replicas == 3 {
			ratio := r.selectToAvail.Seconds() / base.selectToAvail.Seconds()
			fmt.Printf("  selection to available: true at 3 replicas %.1f s vs one replica pulling alone %.1f s: %.2fx (target <= %.1fx: %s); every replica serving after %.1f s\n",
				r.selectToAvail.Seconds(), base.selectToAvail.Seconds(), ratio, availabilityRatio, verdict(ratio <= availabilityRatio), r.selectToAll.Seconds())
		}
	}
	if !peers {
		fmt.Println("  (this osimages has no peer fills: each replica pulled from the registry, and available: true was written by the first replica done)")
	}
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "NOT met"
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
