package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/sylva-projects/osimages/internal/testenv"
)

// The scenarios.
const (
	// orderly: the replicas start, each is listed once ready, then the
	// catalog selects the image; clients start once every replica serves
	// it (the aggregate throughput).
	scenarioOrderly = "orderly"
	// simultaneous: every replica starts at once while the catalog
	// already selects the image, each listed (not ready) -list-lag after
	// it listens: pods started together get their addresses, and the
	// endpointslice controller lists them, each at its own moment, so a
	// replica may read its first listing before its peers are in it.
	scenarioSimultaneous = "simultaneous"
	// failover: as orderly, and the replica pulling from the registry (the
	// origin) is killed with SIGKILL once the registry has sent half the
	// layer; its endpoint turns not ready, as the kubelet reports it.
	scenarioFailover = "failover"
	// fanout: 1 then 5 replicas, orderly, at rates where the origin's NIC
	// feeds two followers at the registry's pace, not four.
	scenarioFanout = "fanout"
	// overlap: 1 then 3 replicas, orderly, and the clients start as soon
	// as every replica has read the selection: fill and serving overlap.
	scenarioOverlap = "overlap"
)

var allScenarios = []string{scenarioOrderly, scenarioSimultaneous, scenarioFailover, scenarioOverlap, scenarioFanout}

// spec is one case of a scenario: its replica count and rates.
type spec struct {
	scenario string
	replicas int
	rates    rates
	clients  int
}

func (s spec) String() string { return fmt.Sprintf("%s, %d replica(s)", s.scenario, s.replicas) }

// runResult is what one run of a spec measured.
type runResult struct {
	egress int64
	// toAvailable: selection to available: true in the output (0: not
	// within the run).
	toAvailable time.Duration
	// toServing: selection to each replica holding the image verified
	// (0 for a killed one); allServing is the last of them.
	toServing  []time.Duration
	allServing time.Duration
	clients    []clientResult
	// clientsAfter: the selection to the clients' start (overlap).
	clientsAfter time.Duration
	// clientWall: the clients' start to their last byte; aggregate is
	// their bytes over it.
	clientWall time.Duration
	aggregate  float64
	cpu        []time.Duration
	load1      [2]float64
	busy       float64
	killed     string
	// killedAt is what the registry had sent of the layer at the kill.
	killedAt int64
}

// env is what every run shares.
type env struct {
	o        options
	k        *testenv.Kube
	dir      string
	values   string
	info     string
	img      image
	proxy    *countingProxy
	peers    bool
	blobSize int64
}

func (e *env) runOne(ctx context.Context, s spec, round int) (res runResult, err error) {
	fmt.Fprintf(os.Stderr, "bench-scale: %s, run %d\n", s, round)
	res.load1[0] = load1()
	cpu0 := machineCPU()
	preselected := s.scenario == scenarioSimultaneous
	info := ""
	if preselected {
		info = e.info
	}
	if err := reset(ctx, e.k.Client, info); err != nil {
		return res, err
	}
	sent0, err := classSent()
	if err != nil {
		return res, err
	}
	dir := filepath.Join(e.dir, fmt.Sprintf("%s-%d-%d", s.scenario, s.replicas, round))
	var replicas []*replica
	defer func() {
		var wg sync.WaitGroup
		for _, r := range replicas {
			wg.Go(r.stop)
		}
		wg.Wait()
		// The images go; with -keep-logs the logs stay.
		for _, r := range replicas {
			os.RemoveAll(filepath.Join(dir, r.id))
		}
		if !e.o.keepLogs {
			os.RemoveAll(dir)
		}
	}()

	before := e.proxy.sent.Load()
	var t0 time.Time
	if preselected {
		t0 = time.Now()
	}
	for i := range s.replicas {
		r, err := startReplica(e.o, e.k, dir, e.values, i, s.replicas, e.peers)
		if err != nil {
			return res, err
		}
		replicas = append(replicas, r)
	}
	var listing errgroup.Group
	if preselected {
		// Listed as soon as it listens, ready once /readyz says so.
		for _, r := range replicas {
			listing.Go(func() error {
				if err := poll(ctx, r.id+" listening", replicas, func() (bool, string) {
					code := status(ctx, r.clientURL+"/healthz")
					return code == 200, fmt.Sprint(code)
				}); err != nil {
					return err
				}
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(e.o.listLag):
				}
				if err := listEndpoint(ctx, e.k.Client, r, false); err != nil {
					return err
				}
				if err := poll(ctx, r.id+" ready", replicas, func() (bool, string) {
					code := status(ctx, r.clientURL+"/readyz")
					return code == 200, fmt.Sprint(code)
				}); err != nil {
					return err
				}
				return listEndpoint(ctx, e.k.Client, r, true)
			})
		}
	} else {
		for _, r := range replicas {
			if err := poll(ctx, r.id+" ready", replicas, func() (bool, string) {
				code := status(ctx, r.clientURL+"/readyz")
				return code == 200, fmt.Sprint(code)
			}); err != nil {
				return res, err
			}
			if err := listEndpoint(ctx, e.k.Client, r, true); err != nil {
				return res, err
			}
		}
		// Selection: the catalog arrives with the image that the values
		// select.
		before = e.proxy.sent.Load()
		t0 = time.Now()
		if err := selectImage(ctx, e.k.Client, e.info); err != nil {
			return res, err
		}
	}

	var clients sync.WaitGroup
	if s.scenario == scenarioOverlap {
		clients.Go(func() {
			// From the moment every replica has read the selection: before,
			// the URL is not served anywhere and 404 is the answer.
			_ = poll(ctx, "every replica to read the selection", replicas, func() (bool, string) {
				for _, r := range replicas {
					if st, err := r.state(ctx); err != nil || st.Images[e.img.sha].Phase == "" {
						return false, r.id + " has not read it"
					}
				}
				return true, ""
			})
			res.clientsAfter = time.Since(t0)
			res.clients = runClients(ctx, s.clients, replicas, e.img)
		})
	}
	var killer errgroup.Group
	if s.scenario == scenarioFailover {
		killer.Go(func() error {
			origin, at, err := e.killOrigin(ctx, replicas, before)
			if err != nil {
				return err
			}
			res.killed, res.killedAt = origin.id, at
			fmt.Fprintf(os.Stderr, "bench-scale: killed %s (SIGKILL) at %s of the %s layer\n", origin.id, human(at), human(e.blobSize))
			// The kubelet sees the container die: the endpoint turns not
			// ready (the pod is not restarted here).
			return listEndpoint(ctx, e.k.Client, origin, false)
		})
	}

	res.toServing = make([]time.Duration, len(replicas))
	err = poll(ctx, "available: true and every replica holding the image", replicas, func() (bool, string) {
		if res.toAvailable == 0 && available(ctx, e.k.Client, e.img.sha) {
			res.toAvailable = time.Since(t0)
		}
		all := true
		for i, r := range replicas {
			if r.killed {
				continue
			}
			// Its own state, not a 200 on its client port: a replica that
			// does not hold the image yet answers clients from a peer's copy.
			if res.toServing[i] == 0 {
				if st, err := r.state(ctx); err == nil && st.Images[e.img.sha].Verified() {
					res.toServing[i] = time.Since(t0)
				}
			}
			all = all && res.toServing[i] > 0
		}
		// The failover's survivors serve; whether they do before the kill
		// is the killer's to say (it fails when there is no origin left).
		if s.scenario == scenarioFailover && res.killed == "" {
			all = false
		}
		return res.toAvailable > 0 && all, fmt.Sprintf("available after %s, serving after %v", res.toAvailable, res.toServing)
	})
	if kerr := killer.Wait(); kerr != nil {
		return res, kerr
	}
	if lerr := listing.Wait(); lerr != nil {
		return res, lerr
	}
	if err != nil {
		return res, err
	}
	res.allServing = slices.Max(res.toServing)
	// Resumes and retries may still be closing: let the registry's
	// connections drain before counting.
	time.Sleep(500 * time.Millisecond)
	res.egress = e.proxy.sent.Load() - before

	switch s.scenario {
	case scenarioOrderly:
		t1 := time.Now()
		res.clients = runClients(ctx, s.clients, replicas, e.img)
		res.clientWall = time.Since(t1)
	case scenarioOverlap:
		clients.Wait()
		res.clientWall = time.Since(t0)
	}
	if len(res.clients) > 0 {
		res.aggregate = float64(len(res.clients)) * float64(e.img.size) / res.clientWall.Seconds()
	}
	for _, r := range replicas {
		res.cpu = append(res.cpu, r.cpuTime())
	}
	res.load1[1] = load1()
	res.busy = machineCPU().busySince(cpu0)
	if err := e.checkShaped(sent0, replicas, res.egress); err != nil {
		return res, err
	}
	fmt.Fprintf(os.Stderr, "bench-scale: %s, run %d: registry %.2fx, available %.1f s, all hold it %.1f s, clients %s, cpu %s, load %.1f\n",
		s, round, float64(res.egress)/float64(e.blobSize), res.toAvailable.Seconds(), res.allServing.Seconds(),
		res.clientSummary(), res.cpuSummary(), res.load1[1])
	return res, nil
}

// killOrigin waits until the registry has sent half the layer since
// before, finds the replica that pulls it (its state says so) and kills
// it. It returns what the registry had sent at the kill.
func (e *env) killOrigin(ctx context.Context, replicas []*replica, before int64) (*replica, int64, error) {
	half := e.blobSize / 2
	var origin *replica
	err := poll(ctx, "the registry to send half the layer", replicas, func() (bool, string) {
		sent := e.proxy.sent.Load() - before
		if sent < half {
			return false, fmt.Sprintf("%s sent", human(sent))
		}
		for _, r := range replicas {
			st, err := r.state(ctx)
			if err == nil && st.Images[e.img.sha].PullsFromRegistry() {
				origin = r
				return true, ""
			}
		}
		return false, fmt.Sprintf("%s sent, no replica says it pulls from the registry", human(sent))
	})
	if err != nil {
		return nil, 0, err
	}
	origin.kill()
	return origin, e.proxy.sent.Load() - before, nil
}

// socketSlack bounds what a loopback TCP socket's buffers hold (the
// kernel's tcp_wmem and tcp_rmem go up to 4 and 6 MiB).
const socketSlack = 12 * mib

// checkShaped refuses a run in which a replica's traffic did not go
// through its tc class: each replica's class must have sent bytes, at
// least what the clients received from it, and the registry's class at
// least what the proxy counted.
func (e *env) checkShaped(sent0 map[string]int64, replicas []*replica, egress int64) error {
	sent1, err := classSent()
	if err != nil {
		return err
	}
	var faults []string
	for _, r := range replicas {
		id := replicaClass(r.index)
		got, want := sent1[id]-sent0[id], max(1, r.served.Load())
		if got < want {
			faults = append(faults, fmt.Sprintf("%s's class %s sent %d bytes, want at least %d (what its clients received)", r.id, id, got, want))
		}
	}
	// The proxy counts what it writes into a socket: what a killed
	// replica's socket still buffered never goes out.
	if got := sent1[registryClass] - sent0[registryClass]; got < max(1, egress-socketSlack) {
		faults = append(faults, fmt.Sprintf("the registry's class %s sent %d bytes, want at least %d (what the proxy counted, less %s that sockets may buffer)", registryClass, got, egress-socketSlack, human(socketSlack)))
	}
	if len(faults) > 0 {
		return fmt.Errorf("run refused: traffic went unshaped (tc -s class show dev lo):\n  %s", strings.Join(faults, "\n  "))
	}
	return nil
}

func (r runResult) clientSummary() string {
	if len(r.clients) == 0 {
		return "none"
	}
	first, final := r.clientFailures()
	started := ""
	if r.clientsAfter > 0 {
		started = fmt.Sprintf(" (started %.1f s after the selection)", r.clientsAfter.Seconds())
	}
	return fmt.Sprintf("%.1f MiB/s in %.1f s%s, %d first-answer failures, %d failed", r.aggregate/mib, r.clientWall.Seconds(), started, first, final)
}

// clientFailures counts the clients whose first answer was not the image
// (Ironic's conductor fails those hosts) and those that never got it.
func (r runResult) clientFailures() (first, final int) {
	for _, c := range r.clients {
		if c.firstFailure != "" {
			first++
		}
		if c.err != nil {
			final++
		}
	}
	return first, final
}

func (r runResult) cpuTotal() time.Duration {
	var t time.Duration
	for _, c := range r.cpu {
		t += c
	}
	return t
}

func (r runResult) cpuSummary() string {
	var per []string
	for _, c := range r.cpu {
		per = append(per, fmt.Sprintf("%.1f", c.Seconds()))
	}
	return fmt.Sprintf("%.1f s (%s)", r.cpuTotal().Seconds(), strings.Join(per, "+"))
}
