package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/sylva-projects/osimages/internal/testenv"
)

func TestPropagateRefusesBadInput(t *testing.T) {
	bad := writeFile(t, "rules.yaml", `rules:
- name: images
  source: capm3-os-image-server-os-images
  target: copy
`)
	tests := []struct {
		name string
		args []string
		want []string
	}{
		{"bad rules", []string{"--config", bad}, []string{bad, ".rules[0] (images): source:", "want NAMESPACE/NAME", ".rules[0] (images): namespaceSelector is required"}},
		{"missing rules file", []string{"--config", bad + ".missing"}, []string{"rules.yaml.missing"}},
		{"no workers", []string{"--workers", "0"}, []string{"--workers 0: must be at least 1"}},
		{"bad resync", []string{"--resync", "-1s"}, []string{"--resync -1s: must be positive"}},
		{"bad log format", []string{"--log-format", "xml"}, []string{`--log-format "xml": want json or text`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := run(t, append([]string{"propagate", "--kubeconfig", "/nonexistent"}, tt.args...)...)
			if r.code != 2 {
				t.Fatalf("exit %d, want 2; stderr: %s", r.code, r.stderr)
			}
			for _, w := range tt.want {
				if !strings.Contains(r.stderr, w) {
					t.Errorf("stderr %q does not say %q", r.stderr, w)
				}
			}
		})
	}
}

// replicaProcess is one `osimages propagate` replica.
type replicaProcess struct {
	cmd      *exec.Cmd
	metrics  string
	health   string
	mu       sync.Mutex
	stderr   bytes.Buffer
	done     chan struct{}
	exitCode int
}

func startPropagate(t *testing.T, args ...string) *replicaProcess {
	t.Helper()
	p := &replicaProcess{metrics: loopbackAddr(t), health: loopbackAddr(t), done: make(chan struct{})}
	args = append([]string{"propagate", "--metrics-addr", p.metrics, "--health-addr", p.health}, args...)
	p.cmd = exec.Command(binary, args...)
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			p.mu.Lock()
			p.stderr.Write(sc.Bytes())
			p.stderr.WriteByte('\n')
			p.mu.Unlock()
		}
		err := p.cmd.Wait()
		if exitErr, ok := err.(*exec.ExitError); ok {
			p.exitCode = exitErr.ExitCode()
		}
		close(p.done)
	}()
	t.Cleanup(func() {
		p.stop(t)
		if t.Failed() {
			t.Logf("replica on %s logged:\n%s", p.metrics, p.logs())
		}
	})
	return p
}

func (p *replicaProcess) logs() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stderr.String()
}

// stop sends SIGTERM and returns the exit code.
func (p *replicaProcess) stop(t *testing.T) int {
	select {
	case <-p.done:
		return p.exitCode
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
		t.Error("replica did not stop within 30 s of SIGTERM")
	}
	return p.exitCode
}

// metric returns the first sample of the family whose labels include all
// of match, or -1.
func (p *replicaProcess) metric(name string, match ...string) float64 {
	resp, err := http.Get("http://" + p.metrics + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
lines:
	for _, line := range strings.Split(string(body), "\n") {
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		for _, m := range match {
			if !strings.Contains(line, m) {
				continue lines
			}
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err == nil {
			return v
		}
	}
	return -1
}

func (p *replicaProcess) ready() bool {
	resp, err := http.Get("http://" + p.health + "/readyz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

func loopbackAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func waitUntil(t *testing.T, what string, f func() bool) {
	t.Helper()
	testenv.Poll(t, "waiting until "+what, 60*time.Second, 200*time.Millisecond, func() (bool, string) { return f(), "" })
}

// TestPropagateReplicas drives two replicas of the real binary with leader
// election: one leads and writes, the other only watches; when the leader is
// stopped, the other takes over.
func TestPropagateReplicas(t *testing.T) {
	k := apiserver(t)
	ctx := context.Background()
	c := k.Client
	mustCreateNamespace(t, c, "e2e-prop-src", nil)
	for _, ns := range []string{"e2e-prop-1", "e2e-prop-2", "e2e-prop-3"} {
		mustCreateNamespace(t, c, ns, map[string]string{"e2e.osimages/wc": ""})
	}
	src := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: "e2e-prop-src", Name: "served"},
		Data:       map[string]string{"values.yaml": "v1"},
	}
	if _, err := c.CoreV1().ConfigMaps(src.Namespace).Create(ctx, src, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	rules := writeFile(t, "rules.yaml", `rules:
- name: e2e
  source: e2e-prop-src/served
  target: served-copy
  namespaceSelector:
    matchLabels: {e2e.osimages/wc: ""}
`)
	args := []string{"--kubeconfig", k.Kubeconfig, "--config", rules, "--leader-elect", "--leader-election-namespace", "e2e-prop-src"}
	a := startPropagate(t, args...)
	b := startPropagate(t, args...)

	copies := func(want string) func() bool {
		return func() bool {
			for _, ns := range []string{"e2e-prop-1", "e2e-prop-2", "e2e-prop-3"} {
				cm, err := c.CoreV1().ConfigMaps(ns).Get(ctx, "served-copy", metav1.GetOptions{})
				if err != nil || cm.Data["values.yaml"] != want {
					return false
				}
			}
			return true
		}
	}
	waitUntil(t, "3 copies of v1", copies("v1"))
	waitUntil(t, "both replicas ready", func() bool { return a.ready() && b.ready() })

	leading := func(p *replicaProcess) bool {
		return p.metric("leader_election_master_status", `name="osimages-propagate"`) == 1
	}
	var leader, follower *replicaProcess
	waitUntil(t, "one leader", func() bool {
		switch {
		case leading(a) && !leading(b):
			leader, follower = a, b
		case leading(b) && !leading(a):
			leader, follower = b, a
		}
		return leader != nil
	})
	writes := func(p *replicaProcess) float64 {
		return p.metric("osimages_propagate_writes_total", `rule="e2e"`, `action="create"`) +
			p.metric("osimages_propagate_writes_total", `rule="e2e"`, `action="update"`)
	}
	if w := writes(leader); w != 3 {
		t.Errorf("leader wrote %v times, want 3", w)
	}
	if w := writes(follower); w != 0 {
		t.Errorf("follower wrote %v times", w)
	}
	// Both replicas report the copies from their own informers.
	waitUntil(t, "both replicas count 3 copies in sync", func() bool {
		return leader.metric("osimages_propagate_copies", `rule="e2e"`, `state="in_sync"`) == 3 &&
			follower.metric("osimages_propagate_copies", `rule="e2e"`, `state="in_sync"`) == 3
	})

	if code := leader.stop(t); code != 0 {
		t.Errorf("leader exited %d after SIGTERM, want 0", code)
	}
	waitUntil(t, "the follower leads", func() bool { return leading(follower) })
	src.Data["values.yaml"] = "v2"
	if _, err := c.CoreV1().ConfigMaps(src.Namespace).Update(ctx, src, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "3 copies of v2", copies("v2"))

	// Logs are structured: one JSON object a line.
	for _, line := range strings.Split(strings.TrimSpace(follower.logs()), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Errorf("log line is not JSON: %q", line)
			break
		}
	}
	if !strings.Contains(follower.logs(), `"msg":"propagated"`) {
		t.Errorf("no propagation logged:\n%s", follower.logs())
	}
}

func mustCreateNamespace(t *testing.T, c kubernetes.Interface, name string, labels map[string]string) {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
	if _, err := c.CoreV1().Namespaces().Create(context.Background(), ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(fmt.Errorf("creating namespace %s: %w", name, err))
	}
}
