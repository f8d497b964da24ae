//go:build e2e

package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

func goarch() string { return runtime.GOARCH }

// The machine is shared and slow: every wait is generous, and bounded.
const (
	podStartTimeout = 3 * time.Minute
	imageTimeout    = 4 * time.Minute
)

// waitFor polls cond every half second until it holds, and fails the test
// after timeout with what and the last state cond described.
func waitFor(t testing.TB, what string, timeout time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	last := ""
	for {
		ok, state := cond()
		if ok {
			return
		}
		last = state
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s; last: %s", what, timeout, last)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// pods lists the pods of ns matching selector, not being deleted.
func pods(t testing.TB, ns, selector string) []corev1.Pod {
	t.Helper()
	list, err := env.kube.CoreV1().Pods(ns).List(ctx(), metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		t.Fatal(err)
	}
	var out []corev1.Pod
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil {
			out = append(out, p)
		}
	}
	slices.SortFunc(out, func(a, b corev1.Pod) int { return strings.Compare(a.Name, b.Name) })
	return out
}

func podReady(p *corev1.Pod) bool {
	if p.Status.Phase != corev1.PodRunning {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// describePods is one line per pod: phase, readiness, restarts, waiting
// reasons.
func describePods(ps []corev1.Pod) string {
	var b strings.Builder
	for _, p := range ps {
		fmt.Fprintf(&b, "%s %s ready=%v ip=%s", p.Name, p.Status.Phase, podReady(&p), p.Status.PodIP)
		for _, c := range p.Status.ContainerStatuses {
			fmt.Fprintf(&b, " [%s restarts=%d", c.Name, c.RestartCount)
			if c.State.Waiting != nil {
				fmt.Fprintf(&b, " waiting %s: %s", c.State.Waiting.Reason, c.State.Waiting.Message)
			}
			if c.State.Terminated != nil {
				fmt.Fprintf(&b, " terminated %s (%d)", c.State.Terminated.Reason, c.State.Terminated.ExitCode)
			}
			b.WriteString("]")
		}
		b.WriteString("; ")
	}
	return b.String()
}

// waitPodsReady waits until exactly n pods of ns match selector, all
// Running and Ready, and returns them.
func waitPodsReady(t testing.TB, ns, selector string, n int, timeout time.Duration) []corev1.Pod {
	t.Helper()
	var got []corev1.Pod
	waitFor(t, fmt.Sprintf("%d ready pods %s in %s", n, selector, ns), timeout, func() (bool, string) {
		got = pods(t, ns, selector)
		if len(got) != n {
			return false, fmt.Sprintf("%d pods: %s", len(got), describePods(got))
		}
		for _, p := range got {
			if !podReady(&p) {
				return false, describePods(got)
			}
		}
		return true, ""
	})
	return got
}

// configMapDoc returns one data key of a ConfigMap, "" when absent.
func configMapDoc(t testing.TB, ns, name, key string) string {
	t.Helper()
	cm, err := env.kube.CoreV1().ConfigMaps(ns).Get(ctx(), name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return ""
	}
	if err != nil {
		t.Fatal(err)
	}
	return cm.Data[key]
}

// served is contract §6, capm3_os_image_server_images: by sha256, whether
// the image is available and its key. The scenarios read the ConfigMaps as
// their consumers do, by their documented format.
type served map[string]struct {
	Available bool   `json:"available"`
	ImageKey  string `json:"image_key"`
}

func parseServed(doc string) (served, error) {
	var d struct {
		Images served `json:"capm3_os_image_server_images"`
	}
	if err := yaml.Unmarshal([]byte(doc), &d); err != nil {
		return nil, err
	}
	return d.Images, nil
}

func servedIn(t testing.TB, ns, name string) served {
	t.Helper()
	s, err := parseServed(configMapDoc(t, ns, name, "values.yaml"))
	if err != nil {
		t.Fatalf("%s/%s: %v", ns, name, err)
	}
	return s
}

// catalogIn is os-images-info's os_images (contract §3): key -> fields.
func catalogIn(t testing.TB, ns string) map[string]map[string]any {
	t.Helper()
	var d struct {
		OSImages map[string]map[string]any `json:"os_images"`
	}
	if err := yaml.Unmarshal([]byte(configMapDoc(t, ns, "os-images-info", "values.yaml")), &d); err != nil {
		t.Fatalf("%s/os-images-info: %v", ns, err)
	}
	return d.OSImages
}

// run runs a command inside the cluster's namespace (this process's), and
// returns its standard output; it fails the test, with both streams, when
// the command fails.
func run(t testing.TB, name string, args ...string) string {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.Env = os.Environ()
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s: %v\nstdout:\n%s\nstderr:\n%s", name, strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String()
}

// podLog returns the log of one container of a pod.
func podLog(t testing.TB, ns, pod, container string) string {
	t.Helper()
	rc, err := env.kube.CoreV1().Pods(ns).GetLogs(pod, &corev1.PodLogOptions{Container: container}).Stream(ctx())
	if err != nil {
		t.Fatalf("log of %s/%s: %v", ns, pod, err)
	}
	defer rc.Close()
	data, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// jsonLines decodes the JSON lines of a log into T, skipping other lines.
func jsonLines[T any](log string) []T {
	var out []T
	sc := bufio.NewScanner(strings.NewReader(log))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var v T
		if json.Unmarshal(sc.Bytes(), &v) == nil {
			out = append(out, v)
		}
	}
	return out
}

// diagnose logs, once a test has failed, what an operator would look at:
// the pods of the namespaces given, their recent events and the last lines
// of each container's log.
func diagnose(t *testing.T, namespaces ...string) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		for _, ns := range namespaces {
			list, err := env.kube.CoreV1().Pods(ns).List(ctx(), metav1.ListOptions{})
			if err != nil {
				t.Logf("pods of %s: %v", ns, err)
				continue
			}
			t.Logf("pods of %s: %s", ns, describePods(list.Items))
			events, err := env.kube.CoreV1().Events(ns).List(ctx(), metav1.ListOptions{})
			if err == nil {
				items := events.Items
				if len(items) > 30 {
					items = items[len(items)-30:]
				}
				for _, e := range items {
					t.Logf("event %s %s/%s: %s %s", ns, e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Reason, e.Message)
				}
			}
			for _, p := range list.Items {
				for _, c := range p.Spec.Containers {
					rc, err := env.kube.CoreV1().Pods(ns).GetLogs(p.Name, &corev1.PodLogOptions{Container: c.Name, TailLines: ptr(int64(15))}).Stream(ctx())
					if err != nil {
						continue
					}
					data, _ := io.ReadAll(rc)
					rc.Close()
					t.Logf("log of %s/%s %s (last lines):\n%s", ns, p.Name, c.Name, data)
				}
			}
		}
	})
}

func ptr[T any](v T) *T { return &v }

// restricted is the security context PodSecurity's "restricted" profile
// asks of a container: the scenarios' own pods run under the same rules
// as the chart's (the release namespace enforces that profile).
func restricted() *corev1.SecurityContext {
	return &corev1.SecurityContext{
		RunAsNonRoot:             ptr(true),
		RunAsUser:                ptr(int64(65532)),
		ReadOnlyRootFilesystem:   ptr(true),
		AllowPrivilegeEscalation: ptr(false),
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
}

// ensureNamespace creates ns with labels, or sets them.
func ensureNamespace(t testing.TB, ns string, labels map[string]string) {
	t.Helper()
	obj := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: labels}}
	_, err := env.kube.CoreV1().Namespaces().Create(ctx(), obj, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		cur, err := env.kube.CoreV1().Namespaces().Get(ctx(), ns, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if cur.Labels == nil {
			cur.Labels = map[string]string{}
		}
		for k, v := range labels {
			cur.Labels[k] = v
		}
		_, err = env.kube.CoreV1().Namespaces().Update(ctx(), cur, metav1.UpdateOptions{})
	}
	if err != nil {
		t.Fatal(err)
	}
}

// applyConfigMap creates or replaces the data of a ConfigMap.
func applyConfigMap(t testing.TB, ns, name string, labels, data map[string]string) {
	t.Helper()
	cms := env.kube.CoreV1().ConfigMaps(ns)
	cm, err := cms.Get(ctx(), name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = cms.Create(ctx(), &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels}, Data: data}, metav1.CreateOptions{})
	} else if err == nil {
		cm.Data = data
		_, err = cms.Update(ctx(), cm, metav1.UpdateOptions{})
	}
	if err != nil {
		t.Fatal(err)
	}
}

// keepLogs follows the log of every container of the pods of namespaces,
// each start of it, into dir (one file per pod and container): the
// kubelet removes a pod's logs with the pod, and the scenarios delete,
// evict and uninstall. It runs until the test ends.
func keepLogs(t *testing.T, dir string, namespaces ...string) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	t.Cleanup(func() { close(done); wg.Wait() })
	followed := map[string]bool{}
	follow := func(p corev1.Pod, c string, restarts int32) {
		defer wg.Done()
		f, err := os.OpenFile(filepath.Join(dir, p.Namespace+"_"+p.Name+"_"+c+".log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		if err != nil {
			return
		}
		defer f.Close()
		fmt.Fprintf(f, "--- %s/%s %s (uid %s, start %d)\n", p.Namespace, p.Name, c, p.UID, restarts)
		rc, err := env.kube.CoreV1().Pods(p.Namespace).GetLogs(p.Name, &corev1.PodLogOptions{Container: c, Follow: true}).Stream(ctx())
		if err != nil {
			fmt.Fprintf(f, "--- %v\n", err)
			return
		}
		go func() { <-done; rc.Close() }()
		io.Copy(f, rc)
		rc.Close()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			for _, ns := range namespaces {
				list, err := env.kube.CoreV1().Pods(ns).List(ctx(), metav1.ListOptions{})
				if err != nil {
					continue
				}
				for _, p := range list.Items {
					for _, cs := range append(p.Status.ContainerStatuses, p.Status.EphemeralContainerStatuses...) {
						key := fmt.Sprintf("%s/%s/%d", p.UID, cs.Name, cs.RestartCount)
						if cs.State.Running == nil || followed[key] {
							continue
						}
						followed[key] = true
						wg.Add(1)
						go follow(p, cs.Name, cs.RestartCount)
					}
				}
			}
			select {
			case <-done:
				return
			case <-time.After(2 * time.Second):
			}
		}
	}()
}
