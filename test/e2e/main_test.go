//go:build e2e

// Package e2e runs charts/osimages and the image `make image` builds on a
// real one-node Kubernetes cluster (hack/e2e-cluster.sh), as an operator
// does: helm install, upgrade, rollback and uninstall through Helm's own
// library, pods run by the kubelet under containerd, Services through
// kube-proxy, PVCs bound to local volumes, an OCI registry running as a pod.
// `make e2e` (hack/e2e.sh) builds everything, starts the cluster and runs
// this package inside the cluster's network namespace; it is not part of
// `go test ./...` (build tag e2e).
package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// cluster is the running cluster and what the scenarios run.
type cluster struct {
	// root is the checkout, chart its chart.
	root, chart string
	// dir is the cluster's work directory (hack/e2e-cluster.sh), its logs
	// under logs/.
	dir        string
	kubeconfig string
	config     *rest.Config
	kube       kubernetes.Interface
	dyn        dynamic.Interface
	// osimages is the static binary `make image` packaged.
	osimages string
	// script is hack/e2e-cluster.sh, which stops and starts the node.
	script string
	// containerd is the socket of the node's containerd.
	containerd string
	// shared is ../shared, "" when absent.
	shared string
}

var env *cluster

func TestMain(m *testing.M) {
	if os.Getenv("OSIMAGES_E2E") == "" {
		fmt.Fprintln(os.Stderr, "test/e2e runs on the cluster `make e2e` starts (hack/e2e.sh), inside its network namespace; run make e2e")
		os.Exit(1)
	}
	var err error
	env, err = newCluster()
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

func newCluster() (*cluster, error) {
	root := os.Getenv("OSIMAGES_E2E_ROOT")
	dir := os.Getenv("E2E_DIR")
	kubeconfig := filepath.Join(dir, "admin.kubeconfig")
	if root == "" || dir == "" {
		return nil, fmt.Errorf("OSIMAGES_E2E_ROOT and E2E_DIR must name the checkout and the cluster's directory (hack/e2e.sh sets them)")
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("the cluster's kubeconfig: %w", err)
	}
	// The scenarios poll; the defaults (5 requests/s) would slow them.
	cfg.QPS, cfg.Burst = 50, 100
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	if _, err := kube.Discovery().ServerVersion(); err != nil {
		return nil, fmt.Errorf("the cluster's apiserver does not answer (is this process in its network namespace?): %w", err)
	}
	c := &cluster{
		root: root, chart: filepath.Join(root, "charts", "osimages"), dir: dir,
		kubeconfig: kubeconfig, config: cfg, kube: kube, dyn: dyn,
		osimages:   filepath.Join(root, "bin", "linux_"+goarch(), "osimages"),
		script:     filepath.Join(root, "hack", "e2e-cluster.sh"),
		containerd: filepath.Join(dir, "containerd", "containerd.sock"),
		shared:     os.Getenv("OSIMAGES_SHARED_DIR"),
	}
	if _, err := os.Stat(c.osimages); err != nil {
		return nil, fmt.Errorf("the image's binary: %w (make image builds it)", err)
	}
	if c.shared != "" {
		if _, err := os.Stat(c.shared); err != nil {
			c.shared = ""
		}
	}
	return c, nil
}

func ctx() context.Context { return context.Background() }
