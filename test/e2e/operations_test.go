//go:build e2e

package e2e

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Scenario 4: an operator's day on the release while a client downloads
// in a loop: helm upgrade with changed values (proxies, catalog values,
// replicas 3 -> 1 -> 3), a node crash mid-download (kubelet, containerd
// and every container killed, started again), helm rollback, a drain
// against the PodDisruptionBudgets, helm uninstall. No download fails, no
// published image flaps to unavailable, the interrupted download
// continues from its checkpoint, uninstall leaves what the docs say.
func (s *suite) operations(t *testing.T) {
	diagnose(t, releaseNS, clientNS)
	a, d := s.reg.images[imgA], s.reg.images[imgD]
	url := s.url + "/images/" + a.sha256 + "/" + a.filename
	kept := []string{imgA, imgB, imgC}
	watch := watchServed(t, s, kept)
	defer func() {
		if watch != nil {
			watch.stop(t)
		}
	}()
	loop := startLoop(t, "loop-1", url, a.sha256)
	before := s.currentRevision(t)

	// 1. Proxies and catalog values: every pod rolls, one at a time.
	s.vals.proxy = "http://10.215.0.254:3128"
	s.vals.extraCatalog = true
	s.helm.upgrade(s.vals.render())
	waitFor(t, "the new catalog Job's os-images-info", 2*time.Minute, func() (bool, string) {
		_, ok := catalogIn(t, releaseNS)[extraKey]
		return ok, "no " + extraKey
	})
	for _, p := range waitPodsReady(t, releaseNS, serverSelector, 3, podStartTimeout) {
		if !hasEnv(p.Spec.Containers[0], "HTTPS_PROXY", s.vals.proxy) {
			t.Errorf("%s has no HTTPS_PROXY=%s after the upgrade", p.Name, s.vals.proxy)
		}
	}
	// 3 -> 1: the pod stays as it is, two go.
	s.vals.replicas = 1
	s.helm.upgrade(s.vals.render())
	waitPodsReady(t, releaseNS, serverSelector, 1, podStartTimeout)

	// 2. The node crashes while the server downloads D; it continues from
	// its checkpoint once the node is back.
	s.reg.pace(t, 512<<10)
	s.vals.selected = []string{imgA, imgB, imgC, imgD}
	s.helm.upgrade(s.vals.render())
	var atCrash int64
	waitFor(t, "a third of "+imgD+" downloaded", imageTimeout, func() (bool, string) {
		sent, reqs := s.reg.sent(t, imgD)
		atCrash = sent
		return sent >= d.layerSize/3, remotes(reqs, podIPs(t))
	})
	loop.stop(t)
	// The server has a checkpoint of what came (on its volume, written at
	// least once a second while the download is slow).
	server := pods(t, releaseNS, serverSelector)[0]
	checkpoint := filepath.Join(volumeHostPath(t, server), "partial", d.sha256, ".checkpoint.json")
	waitFor(t, "a checkpoint of "+imgD, time.Minute, func() (bool, string) {
		_, err := os.Stat(checkpoint)
		return err == nil, fmt.Sprint(err)
	})
	_, reqs := s.reg.sent(t, imgD)
	crashed := time.Now()
	run(t, env.script, "crash-node")
	// The registry is a pod of this node too: it comes back at full speed
	// (its pace and its counts start again with its process).
	t.Logf("node crashed with %d of %d bytes of %s's layer sent (%d requests)", atCrash, d.layerSize, imgD, len(reqs))
	run(t, env.script, "start-node")
	waitNodeReady(t)
	// The pods as they were, their containers started again by the kubelet
	// (the registry's counts start again with its process).
	waitRestarted(t, releaseNS, serverSelector, 1, crashed)
	waitRestarted(t, releaseNS, controllerSelector, 2, crashed)
	waitRestarted(t, registryNS, "app=registry", 1, crashed)
	t.Logf("node and pods back %.1f s after the crash", time.Since(crashed).Seconds())
	waitFor(t, imgD+" available after the crash", imageTimeout, func() (bool, string) {
		got := servedIn(t, releaseNS, servedCM)
		return got[d.sha256].Available, fmt.Sprint(got)
	})
	resumed := false
	after, all := s.reg.sent(t, imgD)
	for _, r := range all {
		if r.Start > 0 {
			resumed = true
		}
	}
	total := atCrash + after
	t.Logf("%s after the crash: %d bytes more from the registry, %d in all for a %d-byte layer (%s)", imgD, after, total, d.layerSize, remotes(all, podIPs(t)))
	if !resumed || after >= d.layerSize {
		t.Errorf("the download of %s did not continue from its checkpoint: after the crash the registry sent %d bytes of the %d-byte layer, from offsets %s",
			imgD, after, d.layerSize, offsets(all, crashed))
	}
	if err := verifiedDownload(pods(t, releaseNS, serverSelector)[0].Status.PodIP, d); err != nil {
		t.Error(err)
	}
	loop = startLoop(t, "loop-2", url, a.sha256)

	// 3. Back to three replicas; the new ones fill from the first.
	sentD := after
	s.vals.replicas = 3
	s.helm.upgrade(s.vals.render())
	waitPodsReady(t, releaseNS, serverSelector, 3, podStartTimeout)
	waitFor(t, "every image available on three replicas", imageTimeout, func() (bool, string) {
		got := servedIn(t, releaseNS, servedCM)
		for _, k := range []string{imgA, imgB, imgC, imgD} {
			if !got[s.reg.images[k].sha256].Available {
				return false, fmt.Sprint(got)
			}
		}
		return true, ""
	})
	if now, _ := s.reg.sent(t, imgD); float64(now-sentD) > 0.05*float64(d.layerSize) {
		t.Errorf("scaling 1 -> 3 pulled %d more bytes of %s from the registry: the new replicas did not fill from their peer", now-sentD, imgD)
	}

	// 4. helm rollback to the revision before this scenario: no proxies,
	// the former catalog, D no longer selected.
	s.helm.rollback(before)
	waitPodsReady(t, releaseNS, serverSelector, 3, podStartTimeout)
	for _, p := range pods(t, releaseNS, serverSelector) {
		if hasEnv(p.Spec.Containers[0], "HTTPS_PROXY", s.vals.proxy) {
			t.Errorf("%s still has HTTPS_PROXY after the rollback", p.Name)
		}
	}
	waitFor(t, "the former catalog after the rollback", 2*time.Minute, func() (bool, string) {
		_, ok := catalogIn(t, releaseNS)[extraKey]
		return !ok, extraKey + " still in os-images-info"
	})
	waitFor(t, imgD+" no longer published after the rollback", 2*time.Minute, func() (bool, string) {
		got := servedIn(t, releaseNS, servedCM)
		_, ok := got[d.sha256]
		return !ok, fmt.Sprint(got)
	})
	s.vals.proxy, s.vals.extraCatalog, s.vals.selected = "", false, []string{imgA, imgB, imgC}

	// 5. A drain: the node cordoned, every server and controller pod
	// evicted through the Eviction API as kubectl drain does. Evicted pods
	// cannot come back on a cordoned node, so the budgets must refuse the
	// evictions past the first of each.
	s.drain(t)

	loop.stop(t)
	watch.stop(t)
	for _, v := range watch.violations {
		t.Error(v)
	}
	watch = nil

	// 6. helm uninstall.
	s.uninstall(t)
}

const extraKey = "e2e-hand-declared"

func hasEnv(c corev1.Container, name, value string) bool {
	for _, e := range c.Env {
		if e.Name == name && e.Value == value {
			return true
		}
	}
	return false
}

func (s *suite) currentRevision(t *testing.T) int {
	t.Helper()
	list, err := env.kube.CoreV1().Secrets(releaseNS).List(ctx(), metav1.ListOptions{LabelSelector: "owner=helm,name=" + releaseName + ",status=deployed"})
	if err != nil || len(list.Items) != 1 {
		t.Fatalf("the deployed release: %v (%d records)", err, len(list.Items))
	}
	var v int
	fmt.Sscan(list.Items[0].Labels["version"], &v)
	return v
}

func offsets(reqs []*blobRequest, after time.Time) string {
	var out []string
	for _, r := range reqs {
		if r.Began.After(after) {
			out = append(out, fmt.Sprintf("%d (sent %d)", r.Start, r.Sent))
		}
	}
	return strings.Join(out, ", ")
}

func waitNodeReady(t *testing.T) {
	t.Helper()
	waitFor(t, "the node Ready again", 3*time.Minute, func() (bool, string) {
		nodes, err := env.kube.CoreV1().Nodes().List(ctx(), metav1.ListOptions{})
		if err != nil || len(nodes.Items) != 1 {
			return false, fmt.Sprint(err)
		}
		for _, c := range nodes.Items[0].Status.Conditions {
			if c.Type == corev1.NodeReady {
				return c.Status == corev1.ConditionTrue, c.Message
			}
		}
		return false, "no Ready condition"
	})
}

// clientLoop is a pod downloading one URL again and again.
type clientLoop struct {
	name string
}

func startLoop(t *testing.T, name, url, sha string) *clientLoop {
	t.Helper()
	pod := clientPod(name, "fetch", "--loop", url, sha)
	pod.Spec.RestartPolicy = corev1.RestartPolicyNever
	if _, err := env.kube.CoreV1().Pods(clientNS).Create(ctx(), pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, name+" downloading", podStartTimeout, func() (bool, string) {
		p, err := env.kube.CoreV1().Pods(clientNS).Get(ctx(), name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		if p.Status.Phase != corev1.PodRunning {
			return false, describePods([]corev1.Pod{*p})
		}
		return len(jsonLines[attempt](podLog(t, clientNS, name, "client"))) > 0, "no download finished yet"
	})
	return &clientLoop{name: name}
}

type attempt struct {
	Time   time.Time `json:"time"`
	OK     bool      `json:"ok"`
	Status int       `json:"status"`
	Bytes  int64     `json:"bytes"`
	Millis int64     `json:"ms"`
	Error  string    `json:"error"`
}

// stop ends the loop and fails the test for every download that failed.
func (l *clientLoop) stop(t *testing.T) {
	t.Helper()
	attempts := jsonLines[attempt](podLog(t, clientNS, l.name, "client"))
	if err := env.kube.CoreV1().Pods(clientNS).Delete(ctx(), l.name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	var failed []string
	var bytes int64
	for _, a := range attempts {
		bytes += a.Bytes
		if !a.OK {
			failed = append(failed, fmt.Sprintf("%s after %d ms: %s", a.Time.Format("15:04:05.000"), a.Millis, a.Error))
		}
	}
	t.Logf("client %s: %d downloads (%d MiB), %d failed", l.name, len(attempts), bytes>>20, len(failed))
	for _, f := range failed {
		t.Errorf("client %s: a download failed at %s", l.name, f)
	}
}

// drain cordons the node and evicts the release's pods through the
// Eviction API, as kubectl drain does: each pod that was on the node, by
// its UID, again and again while the budget refuses, for a bounded time.
// An evicted pod cannot come back on the cordoned node (its StatefulSet or
// ReplicaSet makes a new one, Pending), so each budget must let exactly
// one go and refuse the others, and the ready pods never drop below what
// it promises. Then the node is uncordoned and everything comes back.
func (s *suite) drain(t *testing.T) {
	t.Helper()
	node := nodeName(t)
	cordon(t, node, true)
	defer cordon(t, node, false)
	for _, group := range []struct {
		selector string
		n        int
	}{{serverSelector, 3}, {controllerSelector, 2}} {
		ps := pods(t, releaseNS, group.selector)
		if len(ps) != group.n {
			t.Fatalf("%d pods %s before the drain, want %d", len(ps), group.selector, group.n)
		}
		evicted := map[string]bool{}
		refused := 0
		deadline := time.Now().Add(20 * time.Second)
		for time.Now().Before(deadline) {
			for _, p := range ps {
				if evicted[p.Name] {
					continue
				}
				uid := p.UID
				err := env.kube.PolicyV1().Evictions(releaseNS).Evict(ctx(), &policyv1.Eviction{
					ObjectMeta:    metav1.ObjectMeta{Name: p.Name, Namespace: releaseNS},
					DeleteOptions: &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}},
				})
				switch {
				case err == nil:
					evicted[p.Name] = true
				case apierrors.IsTooManyRequests(err):
					refused++
				default:
					t.Fatalf("evicting %s: %v", p.Name, err)
				}
			}
			ready := 0
			for _, p := range pods(t, releaseNS, group.selector) {
				if podReady(&p) {
					ready++
				}
			}
			if ready < group.n-1 {
				t.Errorf("%s: %d of %d pods ready during the drain: the budget let more than one go", group.selector, ready, group.n)
			}
			time.Sleep(2 * time.Second)
		}
		t.Logf("drain %s: %d of %d pods evicted, %d evictions refused by the PodDisruptionBudget", group.selector, len(evicted), group.n, refused)
		if len(evicted) != 1 || refused == 0 {
			t.Errorf("drain %s: %d pods evicted and %d evictions refused, want 1 evicted and the others refused while the node is cordoned", group.selector, len(evicted), refused)
		}
	}
	cordon(t, node, false)
	waitPodsReady(t, releaseNS, serverSelector, 3, podStartTimeout)
	waitPodsReady(t, releaseNS, controllerSelector, 2, podStartTimeout)
}

func nodeName(t *testing.T) string {
	nodes, err := env.kube.CoreV1().Nodes().List(ctx(), metav1.ListOptions{})
	if err != nil || len(nodes.Items) != 1 {
		t.Fatalf("the node: %v", err)
	}
	return nodes.Items[0].Name
}

func cordon(t *testing.T, node string, on bool) {
	patch := fmt.Sprintf(`{"spec":{"unschedulable":%v}}`, on)
	if _, err := env.kube.CoreV1().Nodes().Patch(ctx(), node, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// uninstall removes the release and checks what is left against the
// chart README: the volumes and the ConfigMaps marked "keep" stay, with
// what the components made at run time; nothing else of the release.
func (s *suite) uninstall(t *testing.T) {
	t.Helper()
	rel := s.helm.current()
	s.helm.uninstall()
	waitFor(t, "the release's pods gone", 2*time.Minute, func() (bool, string) {
		left := pods(t, releaseNS, "app.kubernetes.io/instance=osimages")
		return len(left) == 0, describePods(left)
	})
	for _, o := range manifestObjects(t, rel) {
		kept := o.GetAnnotations()["helm.sh/resource-policy"] == "keep"
		if present := exists(t, o); present != kept {
			t.Errorf("%s after uninstall: present %v, want %v", describe(o), present, kept)
		}
	}
	for i := 0; i < 3; i++ {
		name := fmt.Sprintf("data-osimages-server-%d", i)
		pvc, err := env.kube.CoreV1().PersistentVolumeClaims(releaseNS).Get(ctx(), name, metav1.GetOptions{})
		if err != nil {
			t.Errorf("PVC %s after uninstall: %v, want it kept (the images outlive the release)", name, err)
		} else if pvc.Status.Phase != corev1.ClaimBound {
			t.Errorf("PVC %s after uninstall: %s, want Bound", name, pvc.Status.Phase)
		}
	}
	// What the components made at run time stays, as the README says.
	for _, want := range []struct{ ns, name string }{
		{releaseNS, "osimages-fleet-needs"},
		{"e2e-wc1", servedCopy}, {"e2e-wc1", "osimages-status"}, {"e2e-wc1", "os-images-info"},
	} {
		if _, err := env.kube.CoreV1().ConfigMaps(want.ns).Get(ctx(), want.name, metav1.GetOptions{}); err != nil {
			t.Errorf("ConfigMap %s/%s after uninstall: %v (the README says it stays)", want.ns, want.name, err)
		}
	}
	for _, lease := range []string{"osimages-server-publisher", leaseName} {
		if _, err := env.kube.CoordinationV1().Leases(releaseNS).Get(ctx(), lease, metav1.GetOptions{}); err != nil {
			t.Errorf("Lease %s after uninstall: %v (the README says it stays)", lease, err)
		}
	}
	// The served set stays readable by its consumers.
	if got := servedIn(t, releaseNS, servedCM); !got[s.reg.images[imgA].sha256].Available {
		t.Errorf("the kept output after uninstall: %v", got)
	}
	t.Logf("uninstall left what the chart README lists: the 3 PVCs, the kept ConfigMaps, the Leases, the fleet's needs, the workload namespaces' copies, statuses and catalogs")
	// And the Service no longer answers.
	client := &http.Client{Timeout: 5 * time.Second}
	if resp, err := client.Get(s.url + "/healthz"); err == nil {
		resp.Body.Close()
		t.Errorf("the image server's Service still answers after uninstall: %s", resp.Status)
	}
}

// waitRestarted waits until n pods match selector, ready, each container
// started after since: the kubelet ran them again.
func waitRestarted(t *testing.T, ns, selector string, n int, since time.Time) {
	t.Helper()
	waitFor(t, fmt.Sprintf("%d pods %s in %s running again", n, selector, ns), podStartTimeout, func() (bool, string) {
		got := pods(t, ns, selector)
		if len(got) != n {
			return false, describePods(got)
		}
		for _, p := range got {
			if !podReady(&p) {
				return false, describePods(got)
			}
			for _, c := range p.Status.ContainerStatuses {
				if c.State.Running == nil || c.State.Running.StartedAt.Time.Before(since) {
					return false, describePods(got)
				}
			}
		}
		return true, ""
	})
}
