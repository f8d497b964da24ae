//go:build e2e

package e2e

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/testenv"
)

const (
	serverSelector     = "app.kubernetes.io/instance=osimages,app.kubernetes.io/component=server"
	controllerSelector = "app.kubernetes.io/instance=osimages,app.kubernetes.io/component=controller"
	servedCM           = "capm3-os-image-server-os-images"
	clientNS           = "e2e-clients"
)

// Scenario 1: helm install with the catalog Job; every pod runs and is
// ready, the Job completes and writes os-images-info, the server pulls
// from the registry pod, verifies and serves; a client pod downloads
// through the URL `osimages render` writes, via the Service, and Ironic's
// own download code fetches the same URL.
func (s *suite) install(t *testing.T) {
	diagnose(t, releaseNS, registryNS)
	// The restricted profile of PodSecurity, enforced by the apiserver:
	// the chart's pods, and the scenarios' own, must meet it.
	restrictedNS := map[string]string{"pod-security.kubernetes.io/enforce": "restricted"}
	ensureNamespace(t, releaseNS, restrictedNS)
	ensureNamespace(t, clientNS, restrictedNS)
	s.reg = startRegistry(t)
	s.helm = newHelm(t)
	s.vals = values{reg: s.reg, selected: []string{imgA}, replicas: 1}
	s.helm.install(s.vals.render())

	// Helm waited for the rollouts and the Job; the pods say it too.
	waitPodsReady(t, releaseNS, serverSelector, 1, podStartTimeout)
	waitPodsReady(t, releaseNS, controllerSelector, 2, podStartTimeout)
	jobs, err := env.kube.BatchV1().Jobs(releaseNS).List(ctx(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=catalog"})
	if err != nil {
		t.Fatal(err)
	}
	if len(jobs.Items) != 1 || !jobComplete(&jobs.Items[0]) {
		t.Fatalf("want one complete catalog Job, got %d: %+v", len(jobs.Items), jobs.Items)
	}
	catalog := catalogIn(t, releaseNS)
	for key, img := range s.reg.images {
		if got := catalog[key]["sha256"]; got != img.sha256 {
			t.Errorf("os-images-info: %s has sha256 %v, want %s (the published image)", key, got, img.sha256)
		}
	}
	a := s.reg.images[imgA]
	waitFor(t, "the server publishes "+imgA+" available", imageTimeout, func() (bool, string) {
		got := servedIn(t, releaseNS, servedCM)
		return got[a.sha256].Available, fmt.Sprint(got)
	})
	// The server checked the cosign signature before the first byte: the
	// management registries with their key reached it.
	server := pods(t, releaseNS, serverSelector)[0]
	if log := podLog(t, releaseNS, server.Name, "server"); !strings.Contains(log, "cosign signatures are checked before the download") || !strings.Contains(log, s.reg.host) {
		t.Errorf("%s does not check the cosign signatures of the registry %s:\n%s", server.Name, s.reg.host, log)
	}
	sent, reqs := s.reg.sent(t, imgA)
	t.Logf("the registry sent %d bytes of the %d-byte layer of %s: %s", sent, a.layerSize, imgA, remotes(reqs, podIPs(t)))
	if sent < a.layerSize {
		t.Errorf("the registry sent %d bytes of a %d-byte layer: the server did not pull it from the registry pod", sent, a.layerSize)
	}

	// The URL render writes into the templates, checked against what the
	// server publishes.
	svc, err := env.kube.CoreV1().Services(releaseNS).Get(ctx(), "osimages-server", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s.url = fmt.Sprintf("http://%s:%d", svc.Spec.ClusterIP, svc.Spec.Ports[0].Port)
	url, checksum := renderURL(t, svc.Spec.ClusterIP+fmt.Sprintf(":%d", svc.Spec.Ports[0].Port))
	if checksum != a.sha256 {
		t.Fatalf("render: checksum %s, want %s", checksum, a.sha256)
	}
	if want := s.url + "/images/" + a.sha256 + "/" + a.filename; url != want {
		t.Fatalf("render: url %s, want %s", url, want)
	}
	t.Logf("render: %s", url)

	// A booting host's download, from a pod, through the Service.
	out, ok := runClient(t, "fetch-install", "fetch", url, a.sha256)
	if !ok {
		t.Fatalf("the client pod's download failed: %s", out)
	}
	t.Logf("client pod: %s", strings.TrimSpace(out))

	// Ironic's own image service, from the cluster's network namespace
	// (this process's).
	ironicFetch(t, url, a)

	// The same image through oci://, as BareMetalOperator 0.12 takes it:
	// render with image_delivery: oci, a client pod that reads the manifest
	// and the blob, and Ironic's OciImageService.
	hostPort := svc.Spec.ClusterIP + fmt.Sprintf(":%d", svc.Spec.Ports[0].Port)
	ociURL, ociChecksum := renderURL(t, hostPort, "  image_delivery: oci\n")
	if want := (osimage.OCIReference{Host: hostPort, SHA256: osimage.SHA256(a.sha256), DiskType: "raw"}).String(); ociURL != want || ociChecksum != "" {
		t.Fatalf("render with image_delivery: oci: url %s, checksum %q; want %s and no checksum", ociURL, ociChecksum, want)
	}
	out, ok = runClient(t, "fetch-install-oci", "fetch", ociURL, a.sha256)
	if !ok {
		t.Fatalf("the client pod's download through oci:// failed: %s", out)
	}
	t.Logf("client pod, oci://: %s", strings.TrimSpace(out))
	got, why := testenv.Ironic(t, "", ociURL)
	if why != "" {
		t.Log(why)
		return
	}
	if got[0].Verified != "sha256:"+a.sha256 || got[0].FileSHA256 != a.sha256 {
		t.Fatalf("Ironic's OciImageService on %s: %+v; want sha256 %s verified in transit", ociURL, got[0], a.sha256)
	}
	t.Logf("Ironic's OciImageService: %s verified in transit", got[0].Verified)
}

func jobComplete(j *batchv1.Job) bool {
	for _, c := range j.Status.Conditions {
		if c.Type == batchv1.JobComplete && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

// podIPs maps the address of every pod of the cluster to its name.
func podIPs(t testing.TB) map[string]string {
	t.Helper()
	list, err := env.kube.CoreV1().Pods("").List(ctx(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, p := range list.Items {
		if p.Status.PodIP != "" {
			out[p.Status.PodIP] = p.Name
		}
	}
	return out
}

// workloadClusterValues are a workload cluster's sylva-capi-cluster values
// picking an image by selector, downloaded from provisioningHost.
func workloadClusterValues(name, k8sVersion, selector, provisioningHost string) string {
	return fmt.Sprintf(`name: %s
k8s_version: %s
capi_providers: {infra_provider: capm3, bootstrap_provider: cabpr}
capm3:
  os_image_selector: %s
  image_provisioning_host: %s
  image_provisioning_scheme: http
machine_deployments:
  md0:
    capm3: {nodeReuse: true}
`, name, k8sVersion, selector, provisioningHost)
}

// renderURL runs `osimages render` as an operator does, against the
// release's os-images-info and served set, and returns the image URL and
// checksum of its templates (one image for every level).
// capm3 are more lines of the cluster's capm3 block, such as
// "  image_delivery: oci\n".
func renderURL(t *testing.T, host string, capm3 ...string) (url, checksum string) {
	t.Helper()
	f := filepath.Join(t.TempDir(), "cluster.yaml")
	values := strings.Replace(workloadClusterValues("e2e-cluster", "v1.32.5+rke2r1", "{os: ubuntu, hardened: false}", host),
		"  image_provisioning_scheme: http\n", "  image_provisioning_scheme: http\n"+strings.Join(capm3, ""), 1)
	if err := os.WriteFile(f, []byte(values), 0o600); err != nil {
		t.Fatal(err)
	}
	out := run(t, env.osimages, "render", "-f", f, "--kubeconfig", env.kubeconfig,
		"--os-images-configmap", releaseNS+"/os-images-info", "--served-configmap", releaseNS+"/"+servedCM)
	dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(out), 4096)
	n := 0
	for {
		var obj struct {
			Kind string `json:"kind"`
			Spec struct {
				Template struct {
					Spec struct {
						Image struct {
							URL      string `json:"url"`
							Checksum string `json:"checksum"`
						} `json:"image"`
					} `json:"spec"`
				} `json:"template"`
			} `json:"spec"`
		}
		if err := dec.Decode(&obj); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("render output: %v\n%s", err, out)
		}
		if obj.Kind != "Metal3MachineTemplate" {
			continue
		}
		img := obj.Spec.Template.Spec.Image
		if url != "" && (img.URL != url || img.Checksum != checksum) {
			t.Fatalf("render: two images where one is picked: %s and %s", url, img.URL)
		}
		url, checksum = img.URL, img.Checksum
		n++
	}
	if n == 0 {
		t.Fatalf("render printed no Metal3MachineTemplate:\n%s", out)
	}
	return url, checksum
}

// runClient runs the client image once in a pod of its own with args,
// waits for it to end, and returns its log and whether it succeeded.
func runClient(t *testing.T, name string, args ...string) (string, bool) {
	t.Helper()
	pod := clientPod(name, args...)
	pod.Spec.RestartPolicy = corev1.RestartPolicyNever
	pods := env.kube.CoreV1().Pods(clientNS)
	if _, err := pods.Create(ctx(), pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var phase corev1.PodPhase
	waitFor(t, "client pod "+name+" ends", podStartTimeout, func() (bool, string) {
		p, err := pods.Get(ctx(), name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		phase = p.Status.Phase
		return phase == corev1.PodSucceeded || phase == corev1.PodFailed, describePods([]corev1.Pod{*p})
	})
	out := podLog(t, clientNS, name, "client")
	if err := pods.Delete(ctx(), name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	return out, phase == corev1.PodSucceeded
}

func clientPod(name string, args ...string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: clientNS, Labels: map[string]string{"app": "e2e-client"}},
		Spec: corev1.PodSpec{
			AutomountServiceAccountToken:  ptr(false),
			TerminationGracePeriodSeconds: ptr(int64(5)),
			Containers: []corev1.Container{{
				Name: "client", Image: clientImage, ImagePullPolicy: corev1.PullNever,
				Args: args, SecurityContext: restricted(),
			}},
		},
	}
}

// ironicFetch downloads url with Ironic's own HttpImageService (the code
// of a current Ironic, ../shared/ironic, on Debian's libraries), as the
// conductor does before deploying a host: HEAD for the size, the checksum
// file next to the image, then the download, checked in transit.
func ironicFetch(t *testing.T, url string, img published) {
	t.Helper()
	got, why := testenv.Ironic(t, "", url)
	if why != "" {
		t.Log(why)
		return
	}
	if err := testenv.CheckIronicHTTP(got[0], img.sha256, img.size); err != nil {
		t.Fatal(err)
	}
	t.Logf("Ironic's HttpImageService: HEAD size %d, checksum file and transfer verified %s", got[0].Size(), got[0].Verified)
}
