//go:build e2e

package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

const (
	workloadLabel = "sylva-project.org/workload-cluster"
	servedCopy    = "kyverno-cloned-os-image-server-images"
	leaseName     = "osimages-controller"
	controllerSA  = "system:serviceaccount:" + releaseNS + ":osimages-controller"
)

// workload is a workload-cluster namespace of scenario 3: its catalog
// values, its cluster values and the image they pick.
type workload struct {
	ns, key, selector, k8s string
}

// Scenario 3: the fleet controller with three labelled workload
// namespaces: each gets its catalog, its copy of the served set and its
// status, and the fleet's needs gather them; the leader pod deleted, a new
// leader holds the Lease within its duration, and the old one writes
// nothing after that (the apiserver's audit log says who wrote what).
func (s *suite) controller(t *testing.T) {
	diagnose(t, releaseNS)
	workloads := []workload{
		{"e2e-wc1", imgA, "{os: ubuntu, hardened: false}", "v1.32.5+rke2r1"},
		{"e2e-wc2", imgB, "{os: ubuntu, hardened: true}", "v1.32.5+rke2r1"},
		// Its image is in its catalog but not served: the check says so.
		{"e2e-wc3", imgD, "{os: leapmicro}", "v1.31.9+rke2r1"},
	}
	host := strings.TrimPrefix(s.url, "http://")
	for _, w := range workloads {
		ensureNamespace(t, w.ns, map[string]string{workloadLabel: ""})
		doc, err := yaml.Marshal(s.reg.workloadCatalogValues())
		if err != nil {
			t.Fatal(err)
		}
		applyConfigMap(t, w.ns, "catalog", map[string]string{"osimages.sylva-project.org/catalog-values": ""}, map[string]string{"values.yaml": string(doc)})
		applyConfigMap(t, w.ns, "cluster", map[string]string{"osimages.sylva-project.org/cluster-values": ""},
			map[string]string{"values.yaml": workloadClusterValues(w.ns, w.k8s, w.selector, host)})
	}
	mgmt := servedIn(t, releaseNS, servedCM)
	for _, w := range workloads {
		img := s.reg.images[w.key]
		waitFor(t, w.ns+": catalog, copy and status", 2*time.Minute, func() (bool, string) {
			cat := catalogIn(t, w.ns)
			if cat[w.key]["sha256"] != img.sha256 {
				return false, fmt.Sprintf("os-images-info: %v", cat[w.key])
			}
			// The copy holds what the namespace's catalog names of the
			// served set, or its status lists as needed.
			wantCopy := served{}
			for _, fields := range cat {
				if sha, _ := fields["sha256"].(string); sha != "" {
					if e, ok := mgmt[sha]; ok {
						wantCopy[sha] = e
					}
				}
			}
			for sha := range status(t, w.ns) {
				if e, ok := mgmt[sha]; ok {
					wantCopy[sha] = e
				}
			}
			cp := servedIn(t, w.ns, servedCopy)
			if fmt.Sprint(cp) != fmt.Sprint(wantCopy) {
				return false, fmt.Sprintf("copy %v, want %v (of the served set %v)", cp, wantCopy, mgmt)
			}
			st := status(t, w.ns)
			want := "served"
			if w.key == imgD {
				want = "not-served"
			}
			return st[img.sha256] == want, fmt.Sprintf("status %v", st)
		})
	}
	waitFor(t, "the fleet's needs", time.Minute, func() (bool, string) {
		needs := fleetNeeds(t)
		for _, w := range workloads {
			if !strings.Contains(needs[s.reg.images[w.key].sha256], w.ns) {
				return false, fmt.Sprint(needs)
			}
		}
		return true, ""
	})

	// The leader, deleted as a node drain or an operator would.
	oldLeader, oldLease := leader(t)
	if oldLeader == "" {
		t.Fatalf("no controller holds the Lease %s", leaseName)
	}
	duration := time.Duration(*oldLease.Spec.LeaseDurationSeconds) * time.Second
	deleted := time.Now()
	if err := env.kube.CoreV1().Pods(releaseNS).Delete(ctx(), oldLeader, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	var newLeader string
	waitFor(t, "a new leader", 2*duration+time.Minute, func() (bool, string) {
		newLeader, _ = leader(t)
		return newLeader != "" && newLeader != oldLeader, "holder " + newLeader
	})
	took := time.Since(deleted)
	_, lease := leader(t)
	acquired := lease.Spec.AcquireTime.Time
	t.Logf("leader %s deleted; %s leads %.1f s later (acquired the Lease at %s; lease duration %s)", oldLeader, newLeader, took.Seconds(), acquired.Format(time.RFC3339Nano), duration)
	if took > duration {
		t.Errorf("a new leader took %s after the leader's pod was deleted, more than the lease duration %s", took, duration)
	}

	// The new leader works: a fourth namespace gets its copy and status.
	wc4 := workload{"e2e-wc4", imgA, "{os: ubuntu, hardened: false}", "v1.32.5+rke2r1"}
	ensureNamespace(t, wc4.ns, map[string]string{workloadLabel: ""})
	doc, _ := yaml.Marshal(s.reg.workloadCatalogValues())
	applyConfigMap(t, wc4.ns, "catalog", map[string]string{"osimages.sylva-project.org/catalog-values": ""}, map[string]string{"values.yaml": string(doc)})
	applyConfigMap(t, wc4.ns, "cluster", map[string]string{"osimages.sylva-project.org/cluster-values": ""},
		map[string]string{"values.yaml": workloadClusterValues(wc4.ns, wc4.k8s, wc4.selector, host)})
	waitFor(t, wc4.ns+": copy and status from the new leader", 2*time.Minute, func() (bool, string) {
		cp := servedIn(t, wc4.ns, servedCopy)
		st := status(t, wc4.ns)
		return len(cp) > 0 && st[s.reg.images[imgA].sha256] == "served", fmt.Sprintf("copy %v status %v", cp, st)
	})
	waitPodsReady(t, releaseNS, controllerSelector, 2, podStartTimeout)

	// Who wrote what: the apiserver's audit log names the pod of every
	// ServiceAccount token.
	writes := auditWrites(t, controllerSA)
	var before, after int
	for _, w := range writes {
		if w.pod != oldLeader {
			continue
		}
		if w.at.After(acquired) {
			after++
			t.Errorf("the old leader %s wrote after %s took over: %s %s at %s", oldLeader, newLeader, w.verb, w.uri, w.at.Format(time.RFC3339Nano))
		} else {
			before++
		}
	}
	if before == 0 {
		t.Fatalf("the audit log has no write of the old leader %s at all: it cannot tell who wrote what (%d controller writes in it)", oldLeader, len(writes))
	}
	t.Logf("audit log: %d writes of the old leader before the takeover, %d after", before, after)
}

// leader is the pod holding the controller's Lease (controller-runtime's
// identity is <hostname>_<uuid>, the hostname the pod's name).
func leader(t testing.TB) (string, *coordinationv1.Lease) {
	t.Helper()
	l, err := env.kube.CoordinationV1().Leases(releaseNS).Get(ctx(), leaseName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "" {
		return "", l
	}
	pod, _, _ := strings.Cut(*l.Spec.HolderIdentity, "_")
	return pod, l
}

// status is a workload namespace's osimages-status: sha256 -> state.
func status(t testing.TB, ns string) map[string]string {
	t.Helper()
	var r struct {
		Images []struct {
			SHA256 string `json:"sha256"`
			State  string `json:"state"`
		} `json:"images"`
	}
	if err := yaml.Unmarshal([]byte(configMapDoc(t, ns, "osimages-status", "status.yaml")), &r); err != nil {
		t.Fatalf("%s/osimages-status: %v", ns, err)
	}
	out := map[string]string{}
	for _, img := range r.Images {
		out[img.SHA256] = img.State
	}
	return out
}

// fleetNeeds is the fleet's needs the controller publishes: sha256 -> the
// namespaces needing it.
func fleetNeeds(t testing.TB) map[string]string {
	t.Helper()
	var d struct {
		Images []struct {
			SHA256     string   `json:"sha256"`
			Namespaces []string `json:"namespaces"`
		} `json:"images"`
	}
	if err := yaml.Unmarshal([]byte(configMapDoc(t, releaseNS, "osimages-fleet-needs", "needs.yaml")), &d); err != nil {
		t.Fatalf("osimages-fleet-needs: %v", err)
	}
	out := map[string]string{}
	for _, img := range d.Images {
		out[img.SHA256] = strings.Join(img.Namespaces, ",")
	}
	return out
}

// auditWrite is one write the audit log recorded.
type auditWrite struct {
	pod, verb, uri string
	at             time.Time
}

// auditWrites reads the writes of user from the apiserver's audit log.
func auditWrites(t testing.TB, user string) []auditWrite {
	t.Helper()
	f, err := os.Open(filepath.Join(env.dir, "logs", "audit.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []auditWrite
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 4<<20), 4<<20)
	for sc.Scan() {
		var ev struct {
			Stage      string `json:"stage"`
			Verb       string `json:"verb"`
			RequestURI string `json:"requestURI"`
			User       struct {
				Username string              `json:"username"`
				Extra    map[string][]string `json:"extra"`
			} `json:"user"`
			ResponseStatus struct {
				Code int `json:"code"`
			} `json:"responseStatus"`
			StageTimestamp metav1.MicroTime `json:"stageTimestamp"`
		}
		if json.Unmarshal(sc.Bytes(), &ev) != nil || ev.User.Username != user || ev.Stage != "ResponseComplete" {
			continue
		}
		// A refused write changed nothing.
		if ev.ResponseStatus.Code >= 300 {
			continue
		}
		pod := ""
		if p := ev.User.Extra["authentication.kubernetes.io/pod-name"]; len(p) == 1 {
			pod = p[0]
		}
		out = append(out, auditWrite{pod: pod, verb: ev.Verb, uri: ev.RequestURI, at: ev.StageTimestamp.Time})
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
