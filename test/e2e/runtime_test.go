//go:build e2e

package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Scenario 5: the runtime's own view of the chart's pods. Every container
// runs as 65532 with a read-only root file system (the OCI spec containerd
// gave runc, the process's credentials in /proc); the server has written
// nothing but /data and /tmp (its root file system's overlay upper layer
// is empty, the files the kubelet mounts in are as the kubelet wrote
// them); and from inside the controller pod, its own ServiceAccount token
// is refused Secrets and other components' ConfigMaps by the apiserver.
func (s *suite) runtime(t *testing.T) {
	diagnose(t, releaseNS)
	all := pods(t, releaseNS, "app.kubernetes.io/instance=osimages")
	checked := 0
	for _, p := range all {
		if p.Status.Phase != corev1.PodRunning {
			continue
		}
		for _, cs := range p.Status.ContainerStatuses {
			if cs.State.Running == nil {
				continue
			}
			id := strings.TrimPrefix(cs.ContainerID, "containerd://")
			checkContainer(t, p.Name+"/"+cs.Name, id, cs.State.Running.StartedAt.Time, p.Labels["app.kubernetes.io/component"] == "server")
			checked++
		}
	}
	if checked < 5 {
		t.Fatalf("checked %d running containers of the release, want the 3 server and 2 controller ones: %s", checked, describePods(all))
	}
	// The server did write: its images are in its volume, owned by 65532.
	for _, p := range pods(t, releaseNS, serverSelector) {
		dir := volumeHostPath(t, p)
		n := 0
		filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return nil
			}
			if info, err := d.Info(); err == nil && owner(info) == 65532 {
				n++
			}
			return nil
		})
		if n == 0 {
			t.Errorf("%s: no file owned by 65532 in its volume %s: where did it store its images?", p.Name, dir)
		}
	}

	controllerAccess(t)
}

// ociSpec is the part of the OCI runtime spec the checks read.
type ociSpec struct {
	Process struct {
		User struct {
			UID int `json:"uid"`
			GID int `json:"gid"`
		} `json:"user"`
		NoNewPrivileges bool `json:"noNewPrivileges"`
		Capabilities    struct {
			Bounding  []string `json:"bounding"`
			Effective []string `json:"effective"`
		} `json:"capabilities"`
	} `json:"process"`
	Root struct {
		Readonly bool `json:"readonly"`
	} `json:"root"`
	Mounts []struct {
		Destination string   `json:"destination"`
		Type        string   `json:"type"`
		Source      string   `json:"source"`
		Options     []string `json:"options"`
	} `json:"mounts"`
	Linux struct {
		Seccomp *struct {
			DefaultAction string `json:"defaultAction"`
		} `json:"seccomp"`
	} `json:"linux"`
}

func ctr(t testing.TB, args ...string) string {
	t.Helper()
	return run(t, "ctr", append([]string{"--address", env.containerd, "-n", "k8s.io"}, args...)...)
}

// The runtime's own mounts, besides what the chart asks for: read-only or
// the kernel's, or files the kubelet writes (checked apart).
var runtimeMounts = []string{"/proc", "/dev", "/dev/pts", "/dev/mqueue", "/dev/shm", "/sys", "/sys/fs/cgroup"}
var kubeletFiles = []string{"/etc/hosts", "/etc/hostname", "/etc/resolv.conf", "/dev/termination-log"}

func checkContainer(t *testing.T, name, id string, started time.Time, server bool) {
	t.Helper()
	var info struct {
		Spec ociSpec `json:"Spec"`
	}
	if err := json.Unmarshal([]byte(ctr(t, "containers", "info", id)), &info); err != nil {
		t.Fatalf("%s: containerd's record of container %s: %v", name, id, err)
	}
	spec := info.Spec
	if spec.Process.User.UID != 65532 || spec.Process.User.GID != 65532 {
		t.Errorf("%s: runs as %d:%d, want 65532:65532", name, spec.Process.User.UID, spec.Process.User.GID)
	}
	if !spec.Root.Readonly {
		t.Errorf("%s: root file system is writable", name)
	}
	if !spec.Process.NoNewPrivileges {
		t.Errorf("%s: may gain privileges (noNewPrivileges false)", name)
	}
	if len(spec.Process.Capabilities.Bounding)+len(spec.Process.Capabilities.Effective) > 0 {
		t.Errorf("%s: capabilities %v", name, spec.Process.Capabilities)
	}
	if spec.Linux.Seccomp == nil {
		t.Errorf("%s: no seccomp profile", name)
	}

	// The process as the kernel sees it.
	pid := taskPID(t, id)
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if f := strings.Fields(line); len(f) == 5 && (f[0] == "Uid:" || f[0] == "Gid:") {
			for _, id := range f[1:] {
				if id != "65532" {
					t.Errorf("%s: process %d has %s, want 65532 throughout", name, pid, line)
					break
				}
			}
		}
	}

	// Writable mounts: the chart's, the runtime's, the kubelet's files.
	allowed := []string{"/tmp"}
	if server {
		allowed = append(allowed, "/data")
	}
	for _, m := range spec.Mounts {
		if slices.Contains(m.Options, "ro") || slices.Contains(runtimeMounts, m.Destination) {
			continue
		}
		switch {
		case slices.Contains(allowed, m.Destination):
		case slices.Contains(kubeletFiles, m.Destination):
			fi, err := os.Stat(m.Source)
			if err != nil {
				t.Errorf("%s: %s: %v", name, m.Destination, err)
				continue
			}
			if m.Destination == "/dev/termination-log" && fi.Size() != 0 {
				t.Errorf("%s: wrote %d bytes to /dev/termination-log while running", name, fi.Size())
			}
			if fi.ModTime().After(started.Add(time.Second)) {
				t.Errorf("%s: %s changed at %s, after the container started at %s", name, m.Destination, fi.ModTime(), started)
			}
		default:
			t.Errorf("%s: writable mount %s (%s), beyond %v", name, m.Destination, m.Type, allowed)
		}
	}
	// Nothing written to the root file system: the overlay's upper layer
	// holds only the mount points runc made (the mounts' destinations and
	// their parent directories, empty), nothing the process wrote.
	mountPoints := map[string]bool{}
	for _, m := range spec.Mounts {
		for d := m.Destination; d != "/" && d != "."; d = filepath.Dir(d) {
			mountPoints[d] = true
		}
	}
	upper := upperDir(t, pid)
	var written []string
	filepath.WalkDir(upper, func(path string, d fs.DirEntry, err error) error {
		if err != nil || path == upper {
			return nil
		}
		rel := strings.TrimPrefix(path, upper)
		if mountPoints[rel] {
			if info, err := d.Info(); err == nil && (d.IsDir() || info.Size() == 0) {
				return nil
			}
		}
		written = append(written, rel)
		return nil
	})
	if len(written) > 0 {
		t.Errorf("%s: wrote to its root file system: %v", name, written)
	}
	t.Logf("%s: uid/gid 65532, read-only root (nothing in its upper layer but runc's mount points), no capabilities, seccomp %s", name, spec.Linux.Seccomp.DefaultAction)
}

// taskPID is the host PID of a container's process, as containerd knows it.
func taskPID(t testing.TB, id string) int {
	t.Helper()
	for _, line := range strings.Split(ctr(t, "tasks", "ls"), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == id {
			pid, err := strconv.Atoi(f[1])
			if err == nil {
				return pid
			}
		}
	}
	t.Fatalf("containerd has no task for container %s", id)
	return 0
}

// upperDir is the upper layer of the overlay mounted as the root of the
// process.
func upperDir(t testing.TB, pid int) string {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/mountinfo", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// id parent major:minor root mountpoint options ... - fstype source superoptions
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		fields, tail := strings.Fields(pre), strings.Fields(post)
		if !ok || len(fields) < 5 || fields[4] != "/" || len(tail) < 3 || tail[0] != "overlay" {
			continue
		}
		for _, o := range strings.Split(tail[2], ",") {
			if dir, ok := strings.CutPrefix(o, "upperdir="); ok {
				return dir
			}
		}
	}
	t.Fatalf("process %d has no overlay root with an upper layer", pid)
	return ""
}

// volumeHostPath is where a server pod's data volume is on the node: the
// local volume its claim is bound to.
func volumeHostPath(t testing.TB, p corev1.Pod) string {
	t.Helper()
	for _, v := range p.Spec.Volumes {
		if v.PersistentVolumeClaim == nil {
			continue
		}
		pvc, err := env.kube.CoreV1().PersistentVolumeClaims(p.Namespace).Get(ctx(), v.PersistentVolumeClaim.ClaimName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		pv, err := env.kube.CoreV1().PersistentVolumes().Get(ctx(), pvc.Spec.VolumeName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if pv.Spec.Local == nil {
			t.Fatalf("%s: volume %s is not a local volume", p.Name, pv.Name)
		}
		return pv.Spec.Local.Path
	}
	t.Fatalf("%s has no claim", p.Name)
	return ""
}

// access is one request the controller's token makes, and the answers
// that are right.
type access struct {
	method, path, body string
	want               []int
}

// controllerAccess makes real requests with the controller's own token,
// from inside its pod: an ephemeral container (the client image) in the
// leader's pod, sharing its network and mounting its token volume.
func controllerAccess(t *testing.T) {
	t.Helper()
	// A ConfigMap named as the copies are, in a namespace osimages never
	// made one in: RBAC lets the controller delete that name; the delete
	// guard must refuse it.
	applyConfigMap(t, clientNS, servedCopy, nil, map[string]string{"values.yaml": "not osimages'"})
	forbidden := []int{403}
	checks := []access{
		{"GET", "/api/v1/namespaces/" + releaseNS + "/configmaps/osimages-server-values", "", []int{200}}, // the token works
		{"GET", "/api/v1/namespaces/" + releaseNS + "/secrets", "", forbidden},
		{"GET", "/api/v1/secrets", "", forbidden},
		{"GET", "/api/v1/namespaces/kube-system/secrets", "", forbidden},
		{"POST", "/api/v1/namespaces/" + releaseNS + "/secrets", `{"metadata":{"name":"e2e-stolen"}}`, forbidden},
		{"PATCH", "/api/v1/namespaces/kube-system/configmaps/kube-root-ca.crt", `{"data":{"e2e":"x"}}`, forbidden},
		{"DELETE", "/api/v1/namespaces/kube-system/configmaps/kube-root-ca.crt", "", forbidden},
		{"PATCH", "/api/v1/namespaces/" + releaseNS + "/configmaps/osimages-server-values", `{"data":{"e2e":"x"}}`, forbidden},
		{"PATCH", "/api/v1/namespaces/" + releaseNS + "/configmaps/" + servedCM, `{"data":{"e2e":"x"}}`, forbidden},
		{"DELETE", "/api/v1/namespaces/" + releaseNS + "/configmaps/os-images-info", "", forbidden},
		// Refused by the delete guard (ValidatingAdmissionPolicy), not RBAC.
		{"DELETE", "/api/v1/namespaces/" + clientNS + "/configmaps/" + servedCopy, "", []int{403, 422}},
	}
	var reqs []map[string]string
	for _, c := range checks {
		reqs = append(reqs, map[string]string{"method": c.method, "path": c.path, "body": c.body})
	}
	doc, _ := json.Marshal(reqs)

	name, _ := leader(t)
	pod, err := env.kube.CoreV1().Pods(releaseNS).Get(ctx(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	token := ""
	for _, v := range pod.Spec.Volumes {
		if v.Projected != nil && strings.HasPrefix(v.Name, "kube-api-access-") {
			token = v.Name
		}
	}
	if token == "" {
		t.Fatalf("%s mounts no ServiceAccount token", pod.Name)
	}
	pod.Spec.EphemeralContainers = append(pod.Spec.EphemeralContainers, corev1.EphemeralContainer{
		EphemeralContainerCommon: corev1.EphemeralContainerCommon{
			Name: "e2e-access", Image: clientImage, ImagePullPolicy: corev1.PullNever,
			Args:            []string{"api", string(doc)},
			SecurityContext: restricted(),
			VolumeMounts:    []corev1.VolumeMount{{Name: token, MountPath: "/var/run/secrets/kubernetes.io/serviceaccount", ReadOnly: true}},
		},
		TargetContainerName: "controller",
	})
	if _, err := env.kube.CoreV1().Pods(releaseNS).UpdateEphemeralContainers(ctx(), pod.Name, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("adding an ephemeral container to %s: %v", pod.Name, err)
	}
	waitFor(t, "the access checks in "+pod.Name, podStartTimeout, func() (bool, string) {
		p, err := env.kube.CoreV1().Pods(releaseNS).Get(ctx(), pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, cs := range p.Status.EphemeralContainerStatuses {
			if cs.Name == "e2e-access" {
				return cs.State.Terminated != nil, fmt.Sprintf("%+v", cs.State)
			}
		}
		return false, "no status yet"
	})
	type answer struct {
		Method, Path, Reason, Error string
		Status                      int
	}
	got := jsonLines[answer](podLog(t, releaseNS, pod.Name, "e2e-access"))
	if len(got) != len(checks) {
		t.Fatalf("%d answers to %d requests: %+v", len(got), len(checks), got)
	}
	for i, c := range checks {
		a := got[i]
		if !slices.Contains(c.want, a.Status) {
			t.Errorf("the controller's token, from its pod: %s %s answered %d %s%s, want %v", c.method, c.path, a.Status, a.Reason, a.Error, c.want)
			continue
		}
		t.Logf("the controller's token, from its pod: %s %s -> %d %s", c.method, c.path, a.Status, a.Reason)
	}
	// Nothing of it changed.
	if _, err := env.kube.CoreV1().ConfigMaps(clientNS).Get(ctx(), servedCopy, metav1.GetOptions{}); err != nil {
		t.Errorf("the foreign ConfigMap %s/%s: %v", clientNS, servedCopy, err)
	}
}

// owner is the uid owning a file.
func owner(fi fs.FileInfo) int {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return int(st.Uid)
	}
	return -1
}
