package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/sylva-projects/osimages/internal/devregistry"
)

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

// rates are the tc rates of one scenario.
type rates struct {
	replica, registry string
}

func (r rates) String() string {
	return fmt.Sprintf("each replica's ports %s, the registry's port %s", r.replica, r.registry)
}

// Class IDs of the htb qdisc: the registry's port, and one per replica.
const registryClass = "1:50"

func replicaClass(i int) string { return "1:" + strconv.Itoa(10+i) }

// shape puts an htb qdisc on lo: one class per replica (its client and peer
// ports, as a source port: what the replica sends) and one for the
// registry's port. Everything else (the apiserver, requests, ACKs) is not
// classified and goes unshaped. It replaces the qdisc of an earlier
// scenario.
func shape(r rates, replicas int) error {
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
		if err := tc("class", "add", "dev", "lo", "parent", "1:", "classid", id, "htb",
			"rate", rate, "ceil", rate, "burst", "256k", "cburst", "256k", "quantum", "65536"); err != nil {
			return err
		}
		for _, p := range sports {
			if err := tc("filter", "add", "dev", "lo", "parent", "1:", "protocol", "ip", "prio", "1", "u32",
				"match", "ip", "sport", strconv.Itoa(p), "0xffff", "flowid", id); err != nil {
				return err
			}
		}
		return nil
	}
	if err := class(registryClass, r.registry, registryPort); err != nil {
		return err
	}
	for i := range replicas {
		if err := class(replicaClass(i), r.replica, clientPort+i, peerPort+i); err != nil {
			return err
		}
	}
	return nil
}

// classSent reads the bytes each htb class of lo has sent (tc -s class
// show), by class ID.
func classSent() (map[string]int64, error) {
	out, err := exec.Command("tc", "-s", "class", "show", "dev", "lo").CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("tc -s class show dev lo: %v: %s", err, strings.TrimSpace(string(out)))
	}
	return parseClassSent(string(out))
}

// parseClassSent reads tc -s class show's output: a "class htb 1:10 ..."
// line, then " Sent N bytes M pkt ...".
func parseClassSent(out string) (map[string]int64, error) {
	sent := map[string]int64{}
	class := ""
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) >= 3 && f[0] == "class" && f[1] == "htb":
			class = f[2]
		case len(f) >= 3 && f[0] == "Sent" && f[2] == "bytes" && class != "":
			n, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				return nil, fmt.Errorf("tc -s class show: class %s: %q is not a byte count", class, f[1])
			}
			sent[class] = n
			class = ""
		}
	}
	if len(sent) == 0 {
		return nil, fmt.Errorf("tc -s class show lists no htb class with its counters:\n%s", out)
	}
	return sent, nil
}

// checkShaping downloads the blob once through the shaped proxy and once
// from the registry's own port, unshaped, and refuses to go on when the
// shaped rate is not near the registry's rate.
func checkShaping(ctx context.Context, r rates, regHost string, pub devregistry.Published, blobSize int64) error {
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
	want, err := parseRate(r.registry)
	if err != nil {
		return err
	}
	fmt.Printf("  shaping check, one download of the layer: registry port %.0f Mbit/s (tc rate %s), the registry's own unshaped port %.0f Mbit/s\n",
		shaped/1e6, r.registry, unshaped/1e6)
	if shaped > 1.15*want || shaped < 0.5*want {
		return fmt.Errorf("the shaped download ran at %.0f Mbit/s, not near %s: tc does not shape this loopback as it should; no unshaped numbers are printed", shaped/1e6, r.registry)
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
