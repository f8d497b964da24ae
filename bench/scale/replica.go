package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sylva-projects/osimages/bench/internal/proc"
	"github.com/sylva-projects/osimages/internal/osimage"
	replicaPkg "github.com/sylva-projects/osimages/internal/replica"
	"github.com/sylva-projects/osimages/internal/testenv"
)

// replica is one serve process.
type replica struct {
	id      string
	index   int
	logPath string
	*proc.Process
	// served is what the benchmark's clients received from it.
	served    atomic.Int64
	clientURL string
	peer      replicaPkg.Peer
	// cpu is its CPU time when it was killed (the process is gone then).
	cpu    time.Duration
	killed bool
}

// startReplica starts replica i of a set of count, as the chart does: with
// --replicas count, so that replicas started together wait for each other
// before they choose who pulls.
func startReplica(o options, k *testenv.Kube, dir, values string, i, count int, peers bool) (*replica, error) {
	r := &replica{id: fmt.Sprintf("osimages-server-%d", i), index: i,
		clientURL: fmt.Sprintf("http://127.0.0.1:%d", clientPort+i)}
	r.peer = replicaPkg.Peer{ID: r.id, URL: fmt.Sprintf("http://127.0.0.1:%d", peerPort+i)}
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
			"--peer-listen", fmt.Sprintf(":%d", peerPort+i), "--publisher-lease", lease, "--replicas", strconv.Itoa(count))
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

// kill ends the replica with SIGKILL, as a node failure or the OOM killer
// would: no shutdown, no Lease released, partial files as they are.
func (r *replica) kill() {
	r.cpu = processCPU(r.Pid())
	r.killed = true
	syscall.Kill(-r.Pid(), syscall.SIGKILL)
	<-r.Done()
}

// cpuTime is the CPU time the replica used, up to now or its kill.
func (r *replica) cpuTime() time.Duration {
	if r.killed {
		return r.cpu
	}
	return processCPU(r.Pid())
}

// state is the replica's state as its peers read it.
func (r *replica) state(ctx context.Context) (replicaPkg.State, error) {
	return replicaPkg.FetchState(ctx, http.DefaultClient, r.peer)
}

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
// replica that was not killed exits.
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
				if !r.killed {
					return fmt.Errorf("%s exited while waiting for %s:\n%s", r.id, what, r.logTail())
				}
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
