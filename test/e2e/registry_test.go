//go:build e2e

package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/sylva-projects/osimages/internal/demo"
	"github.com/sylva-projects/osimages/internal/devregistry"
	"github.com/sylva-projects/osimages/internal/osimage"
)

const (
	registryNS    = "e2e-registry"
	registryImage = "docker.io/local/registry:e2e"
	clientImage   = "docker.io/local/client:e2e"
	// dibVersion is the diskimage-builder version every image is published
	// at, as Sylva pins one.
	dibVersion = "0.7.6"
)

// registry is the OCI registry running as a pod in the cluster.
type registry struct {
	// host is the Service's address, host:port, as image references and
	// the catalog values name it.
	host   string
	signer *devregistry.Signer
	// images are the published images, by key (the diskimage-builder
	// image name, the key of os-images-info).
	images map[string]published
}

// published is one artifact in the registry.
type published struct {
	key      string
	sha256   string
	filename string
	// size is the image file's, layerSize the gzip layer's (what the
	// registry sends).
	size, layerSize int64
	layer           string
}

// The four images of the demo, which the scenarios publish at sizes of
// their own: the size decides how long a pull takes once the registry is
// slowed down.
var imageSizes = map[string]int{
	"ubuntu-noble-plain-rke2-1-32":    16 << 20,
	"ubuntu-noble-hardened-rke2-1-32": 24 << 20,
	"ubuntu-noble-plain-kubeadm-1-32": 64 << 20,
	"leapmicro-6-0-plain-rke2-1-31":   64 << 20,
}

// Keys of the scenarios' images.
const (
	imgA = "ubuntu-noble-plain-rke2-1-32"    // installed, downloaded in loops
	imgB = "ubuntu-noble-hardened-rke2-1-32" // selected with three replicas
	imgC = "ubuntu-noble-plain-kubeadm-1-32" // its puller is deleted mid-pull
	imgD = "leapmicro-6-0-plain-rke2-1-31"   // the node crashes mid-pull
)

// startRegistry runs the registry as a Deployment behind a Service, and
// publishes and signs the images into it as diskimage-builder's CI does.
func startRegistry(t *testing.T) *registry {
	t.Helper()
	ensureNamespace(t, registryNS, map[string]string{"pod-security.kubernetes.io/enforce": "restricted"})
	labels := map[string]string{"app": "registry"}
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "registry", Namespace: registryNS},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr(int32(1)),
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					Containers: []corev1.Container{{
						Name: "registry", Image: registryImage, ImagePullPolicy: corev1.PullNever,
						Args:            []string{"--listen=:5000", "--root=/var/lib/registry"},
						Ports:           []corev1.ContainerPort{{Name: "registry", ContainerPort: 5000}},
						ReadinessProbe:  &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/e2e/healthz", Port: intstr.FromString("registry")}}, PeriodSeconds: 2},
						SecurityContext: restricted(),
						VolumeMounts:    []corev1.VolumeMount{{Name: "data", MountPath: "/var/lib/registry"}},
					}},
					Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
				},
			},
		},
	}
	if _, err := env.kube.AppsV1().Deployments(registryNS).Create(ctx(), dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "registry", Namespace: registryNS},
		Spec:       corev1.ServiceSpec{Selector: labels, Ports: []corev1.ServicePort{{Name: "registry", Port: 5000, TargetPort: intstr.FromString("registry")}}},
	}
	created, err := env.kube.CoreV1().Services(registryNS).Create(ctx(), svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	waitPodsReady(t, registryNS, "app=registry", 1, podStartTimeout)
	r := &registry{host: created.Spec.ClusterIP + ":5000", images: map[string]published{}}
	// The Service answers once kube-proxy has its rules.
	waitFor(t, "the registry through its Service", time.Minute, func() (bool, string) {
		resp, err := http.Get("http://" + r.host + "/v2/")
		if err != nil {
			return false, err.Error()
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, resp.Status
	})
	r.signer, err = devregistry.NewSigner()
	if err != nil {
		t.Fatal(err)
	}
	// A client of the registry in this process, as diskimage-builder's CI
	// pushes from outside the cluster.
	pusher := &devregistry.Registry{Host: r.host}
	for i, img := range demo.Images {
		repo := "sylva-projects/sylva-elements/diskimage-builder/" + img.Name
		p, err := pusher.Publish(ctx(), devregistry.DiskImage{
			Repository: repo, Tag: dibVersion, Gzip: true, Fields: img.Fields,
			Content: devregistry.DiskContent(imageSizes[img.Name], uint64(100+i)),
		})
		if err != nil {
			t.Fatalf("publishing %s: %v", img.Name, err)
		}
		if err := pusher.Sign(ctx(), r.signer, repo, p.ManifestDigest, devregistry.SignOptions{}); err != nil {
			t.Fatalf("signing %s: %v", img.Name, err)
		}
		var size, layerSize int64
		fmt.Sscan(p.Fields.Get(osimage.FieldSize), &size)
		fmt.Sscan(p.Fields.Get(osimage.FieldArchiveSize), &layerSize)
		r.images[img.Name] = published{key: img.Name, sha256: p.Fields.Get(osimage.FieldSHA256),
			filename: p.Fields.Get(osimage.FieldFilename), size: size, layerSize: layerSize, layer: p.LayerDigest.String()}
	}
	return r
}

// catalogValues are the sylva-units values of the catalog (contract §2):
// the four images, from the registry in the cluster, signed.
func (r *registry) catalogValues() map[string]any {
	images := map[string]any{}
	for _, img := range demo.Images {
		images[img.Name] = map[string]any{"os_images_oci_registry": "sylva"}
	}
	return map[string]any{
		"sylva_base_oci_registry":        "oci://" + r.host + "/sylva-projects",
		"sylva_diskimagebuilder_version": dibVersion,
		"os_images_oci_registries": map[string]any{
			"sylva": map[string]any{
				"url":              "{{ .Values.sylva_base_oci_registry }}/sylva-elements/diskimage-builder",
				"tag":              "{{ .Values.sylva_diskimagebuilder_version }}",
				"cosign_publickey": r.signer.PublicKeyPEM,
				"enabled":          true,
			},
		},
		"sylva_diskimagebuilder_images": images,
	}
}

// serverRegistries are the management values' os_images_oci_registries,
// resolved, for the image server.
func (r *registry) serverRegistries() map[string]any {
	return map[string]any{
		"sylva": map[string]any{
			"url":              "oci://" + r.host + "/sylva-projects/sylva-elements/diskimage-builder",
			"tag":              dibVersion,
			"cosign_publickey": r.signer.PublicKeyPEM,
			"enabled":          true,
		},
	}
}

// workloadCatalogValues are the catalog values a workload cluster's
// namespace holds for the controller (its sylva-units values): the same
// registry, which speaks plain HTTP. The chart adds oci_registry_insecure
// to the catalog Job's values itself; here the values say it.
func (r *registry) workloadCatalogValues() map[string]any {
	v := r.catalogValues()
	v["oci_registry_insecure"] = true
	return v
}

// blobRequest and blobStats are what the registry reports at /e2e/blobs.
type blobRequest struct {
	Method string    `json:"method"`
	Remote string    `json:"remote"`
	Range  string    `json:"range"`
	Start  int64     `json:"start"`
	Status int       `json:"status"`
	Sent   int64     `json:"sent"`
	Began  time.Time `json:"began"`
	Ended  time.Time `json:"ended"`
}

type blobStats struct {
	Sent     int64          `json:"sent"`
	Requests []*blobRequest `json:"requests"`
}

// blobs returns what the registry has sent, by blob digest.
func (r *registry) blobs(t testing.TB) map[string]blobStats {
	t.Helper()
	resp, err := http.Get("http://" + r.host + "/e2e/blobs")
	if err != nil {
		t.Fatalf("the registry's counts: %v", err)
	}
	defer resp.Body.Close()
	var out map[string]blobStats
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	return out
}

// sent is what the registry has sent of the layer of key, and the
// addresses that asked for it.
func (r *registry) sent(t testing.TB, key string) (int64, []*blobRequest) {
	t.Helper()
	b := r.blobs(t)[r.images[key].layer]
	return b.Sent, b.Requests
}

// pace slows every blob response down to bytesPerSecond (0: full speed).
func (r *registry) pace(t testing.TB, bytesPerSecond int64) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPut, fmt.Sprintf("http://%s/e2e/rate?bytesPerSecond=%d", r.host, bytesPerSecond), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("pacing the registry: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("pacing the registry: %s", resp.Status)
	}
}

// remotes names the pods whose addresses asked for a blob.
func remotes(reqs []*blobRequest, podByIP map[string]string) string {
	var out []string
	for _, r := range reqs {
		name := podByIP[r.Remote]
		if name == "" {
			name = r.Remote
		}
		out = append(out, fmt.Sprintf("%s %s@%d sent %d", name, r.Range, r.Start, r.Sent))
	}
	return strings.Join(out, ", ")
}
