//go:build e2e

package e2e

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Scenario 2: three replicas. The peers are the ones the EndpointSlice
// controller lists from pod readiness; the registry sends each blob once;
// the output says available only once all three hold the image; the pod
// that pulls from the registry, deleted mid-pull, is taken over, and
// nothing unverified is served or published meanwhile.
func (s *suite) replicas(t *testing.T) {
	diagnose(t, releaseNS, registryNS)
	a, b, c := s.reg.images[imgA], s.reg.images[imgB], s.reg.images[imgC]
	sentA, _ := s.reg.sent(t, imgA)

	// Scale out and select B in one upgrade: the new replicas fill A from
	// their peer, and the three of them fill B with one registry pull.
	watch := watchServed(t, s, []string{imgA, imgB})
	s.vals.replicas = 3
	s.vals.selected = []string{imgA, imgB}
	s.helm.upgrade(s.vals.render())
	server := waitPodsReady(t, releaseNS, serverSelector, 3, podStartTimeout)
	waitFor(t, imgB+" available", imageTimeout, func() (bool, string) {
		got := servedIn(t, releaseNS, servedCM)
		return got[b.sha256].Available, fmt.Sprint(got)
	})
	watch.waitAvailable(t, imgB)
	watch.stop(t)

	// The peers: the headless Service's EndpointSlices, as the
	// EndpointSlice controller wrote them from the pods' readiness.
	var listed []string
	for _, sl := range endpointSlices(t, "osimages-server-headless") {
		if sl.Labels[discoveryv1.LabelManagedBy] != "endpointslice-controller.k8s.io" {
			t.Errorf("EndpointSlice %s is managed by %q, not the EndpointSlice controller", sl.Name, sl.Labels[discoveryv1.LabelManagedBy])
		}
		for _, ep := range sl.Endpoints {
			if ep.Conditions.Ready != nil && *ep.Conditions.Ready && ep.TargetRef != nil {
				listed = append(listed, ep.TargetRef.Name)
			}
		}
	}
	var names []string
	for _, p := range server {
		names = append(names, p.Name)
	}
	slices.Sort(listed)
	if strings.Join(listed, ",") != strings.Join(names, ",") {
		t.Fatalf("the headless Service's EndpointSlices list %v ready, want the pods %v", listed, names)
	}

	// Each blob once, counted by the registry.
	sentB, reqsB := s.reg.sent(t, imgB)
	nowA, _ := s.reg.sent(t, imgA)
	ips := podIPs(t)
	t.Logf("registry: %s layer %d bytes, sent %d (%s); %s sent %d more after the scale-out",
		imgB, b.layerSize, sentB, remotes(reqsB, ips), imgA, nowA-sentA)
	if float64(sentB) > 1.05*float64(b.layerSize) {
		t.Errorf("the registry sent %d bytes of the %d-byte layer of %s to three replicas: more than once (%s)", sentB, b.layerSize, imgB, remotes(reqsB, ips))
	}
	if float64(nowA-sentA) > 0.05*float64(a.layerSize) {
		t.Errorf("the registry sent %d more bytes of %s when the replicas joined: they did not fill from their peer", nowA-sentA, imgA)
	}
	for _, v := range watch.violations {
		t.Error(v)
	}

	// The pod that pulls from the registry, deleted mid-pull. The registry
	// is slowed down so that the pull lasts long enough to be caught.
	s.reg.pace(t, 512<<10)
	t.Cleanup(func() { s.reg.pace(t, 0) })
	probe := probeReplicas(t, c)
	watch = watchServed(t, s, []string{imgA, imgB, imgC})
	s.vals.selected = []string{imgA, imgB, imgC}
	s.helm.upgrade(s.vals.render())
	var puller string
	waitFor(t, "a replica pulls a quarter of "+imgC+" from the registry", imageTimeout, func() (bool, string) {
		_, reqs := s.reg.sent(t, imgC)
		ips := podIPs(t)
		for _, r := range reqs {
			if r.Sent >= c.layerSize/4 && r.Ended.IsZero() && ips[r.Remote] != "" {
				puller = ips[r.Remote]
				return true, ""
			}
		}
		return false, remotes(reqs, ips)
	})
	old, err := env.kube.CoreV1().Pods(releaseNS).Get(ctx(), puller, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	if err := env.kube.CoreV1().Pods(releaseNS).Delete(ctx(), puller, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Logf("deleted %s (%s), which was pulling %s from the registry", puller, old.Status.PodIP, imgC)
	// Another replica takes the pull over; then full speed.
	var taker string
	waitFor(t, "another replica pulls "+imgC+" from the registry", imageTimeout, func() (bool, string) {
		_, reqs := s.reg.sent(t, imgC)
		ips := podIPs(t)
		for _, r := range reqs {
			if r.Began.After(deleted) && r.Remote != old.Status.PodIP && ips[r.Remote] != "" {
				taker = ips[r.Remote]
				return true, ""
			}
		}
		return false, remotes(reqs, ips)
	})
	t.Logf("%s took the pull of %s over", taker, imgC)
	s.reg.pace(t, 0)
	waitPodsReady(t, releaseNS, serverSelector, 3, podStartTimeout)
	waitFor(t, imgC+" available on every replica", imageTimeout, func() (bool, string) {
		got := servedIn(t, releaseNS, servedCM)
		return got[c.sha256].Available, fmt.Sprint(got)
	})
	watch.waitAvailable(t, imgC)
	for _, p := range pods(t, releaseNS, serverSelector) {
		if err := verifiedDownload(p.Status.PodIP, c); err != nil {
			t.Errorf("%s: %v", p.Name, err)
		}
	}
	watch.stop(t)
	probe.stop(t)
	sentC, reqsC := s.reg.sent(t, imgC)
	t.Logf("registry: %s layer %d bytes, sent %d in all (%s); replicas answered %d verified downloads of it, %d not-yet answers",
		imgC, c.layerSize, sentC, remotes(reqsC, podIPs(t)), probe.ok, probe.notYet)
	for _, v := range append(watch.violations, probe.violations...) {
		t.Error(v)
	}
}

func endpointSlices(t testing.TB, service string) []discoveryv1.EndpointSlice {
	t.Helper()
	list, err := env.kube.DiscoveryV1().EndpointSlices(releaseNS).List(ctx(), metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + service})
	if err != nil {
		t.Fatal(err)
	}
	return list.Items
}

// imageURL is the path of img on a server replica at ip.
func imageURL(ip string, img published) string {
	return fmt.Sprintf("http://%s:8080/images/%s/%s", ip, img.sha256, img.filename)
}

// verifiedDownload downloads img from the replica at ip and checks every
// byte against the catalog's sha256.
func verifiedDownload(ip string, img published) error {
	resp, err := http.Get(imageURL(ip, img))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", img.key, resp.Status)
	}
	return checkBody(resp.Body, img)
}

func checkBody(r io.Reader, img published) error {
	h := sha256.New()
	n, err := io.Copy(h, r)
	if err != nil {
		return fmt.Errorf("%s: after %d bytes: %w", img.key, n, err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != img.sha256 || n != img.size {
		return fmt.Errorf("%s: served %d bytes of sha256 %s, want %d bytes of %s: UNVERIFIED BYTES SERVED", img.key, n, got, img.size, img.sha256)
	}
	return nil
}

// servedWatch follows the output ConfigMap: each time it says an image of
// keys available, every ready replica listed by the headless Service must
// serve the image's verified bytes; and an image once available must not
// become unavailable or go (a flap).
type servedWatch struct {
	done           chan struct{}
	wg             sync.WaitGroup
	mu             sync.Mutex
	violations     []string
	firstAvailable map[string]time.Time
	versions       int
}

func watchServed(t *testing.T, s *suite, keys []string) *servedWatch {
	w := &servedWatch{done: make(chan struct{}), firstAvailable: map[string]time.Time{}}
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		lastRV := ""
		available, checked := map[string]bool{}, map[string]bool{}
		for {
			select {
			case <-w.done:
				return
			case <-time.After(200 * time.Millisecond):
			}
			cm, err := env.kube.CoreV1().ConfigMaps(releaseNS).Get(ctx(), servedCM, metav1.GetOptions{})
			if err != nil || cm.ResourceVersion == lastRV {
				continue
			}
			lastRV = cm.ResourceVersion
			got, err := parseServed(cm.Data["values.yaml"])
			if err != nil {
				w.add("output %s: %v", cm.ResourceVersion, err)
				continue
			}
			w.mu.Lock()
			w.versions++
			w.mu.Unlock()
			for _, key := range keys {
				img := s.reg.images[key]
				entry, listed := got[img.sha256]
				if available[key] && (!listed || !entry.Available) {
					w.add("output version %s at %s: %s was available and is now listed=%v available=%v: a flap", cm.ResourceVersion, time.Now().Format("15:04:05.000"), key, listed, entry.Available)
				}
				available[key] = listed && entry.Available
				if !available[key] {
					continue
				}
				if checked[key] {
					continue
				}
				checked[key] = true
				// Published available: every ready replica holds it.
				for _, ip := range readyPeers() {
					if err := verifiedDownload(ip, img); err != nil {
						w.add("output says %s available, but the ready replica %s: %v", key, ip, err)
					}
				}
				w.mu.Lock()
				w.firstAvailable[key] = time.Now()
				w.mu.Unlock()
			}
		}
	}()
	return w
}

func (w *servedWatch) add(format string, args ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.violations = append(w.violations, fmt.Sprintf(format, args...))
}

// waitAvailable waits until the watch has seen key published available
// (and checked every ready replica then).
func (w *servedWatch) waitAvailable(t *testing.T, key string) {
	t.Helper()
	waitFor(t, "the watch sees "+key+" available", time.Minute, func() (bool, string) {
		w.mu.Lock()
		defer w.mu.Unlock()
		return !w.firstAvailable[key].IsZero(), fmt.Sprintf("%d output versions seen", w.versions)
	})
}

func (w *servedWatch) stop(t *testing.T) {
	close(w.done)
	w.wg.Wait()
	t.Logf("the output ConfigMap changed %d times while watched", w.versions)
}

// readyPeers are the addresses the headless Service lists ready.
func readyPeers() []string {
	list, err := env.kube.DiscoveryV1().EndpointSlices(releaseNS).List(ctx(), metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=osimages-server-headless"})
	if err != nil {
		return nil
	}
	var out []string
	for _, sl := range list.Items {
		for _, ep := range sl.Endpoints {
			if ep.Conditions.Ready != nil && *ep.Conditions.Ready {
				out = append(out, ep.Addresses...)
			}
		}
	}
	return out
}

// replicaProbe asks every server pod for an image every second: any 200
// must carry the image's verified bytes; 503 (not yet) and refused
// connections (a pod going or coming) are counted, not faults.
type replicaProbe struct {
	done       chan struct{}
	wg         sync.WaitGroup
	mu         sync.Mutex
	violations []string
	ok, notYet int
}

func probeReplicas(t *testing.T, img published) *replicaProbe {
	p := &replicaProbe{done: make(chan struct{})}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		client := &http.Client{Timeout: 2 * time.Minute}
		for {
			select {
			case <-p.done:
				return
			case <-time.After(time.Second):
			}
			list, err := env.kube.CoreV1().Pods(releaseNS).List(ctx(), metav1.ListOptions{LabelSelector: serverSelector})
			if err != nil {
				continue
			}
			for _, pod := range list.Items {
				if pod.Status.PodIP == "" || pod.Status.Phase != corev1.PodRunning {
					continue
				}
				resp, err := client.Get(imageURL(pod.Status.PodIP, img))
				if err != nil {
					continue
				}
				if resp.StatusCode == http.StatusOK {
					err := checkBody(resp.Body, img)
					p.mu.Lock()
					if err != nil {
						p.violations = append(p.violations, fmt.Sprintf("%s: %v", pod.Name, err))
					} else {
						p.ok++
					}
					p.mu.Unlock()
				} else {
					p.mu.Lock()
					p.notYet++
					p.mu.Unlock()
				}
				resp.Body.Close()
			}
		}
	}()
	return p
}

func (p *replicaProbe) stop(t *testing.T) {
	close(p.done)
	p.wg.Wait()
}
