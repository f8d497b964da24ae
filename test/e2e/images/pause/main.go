// Command pause is the sandbox image of the end-to-end cluster
// (hack/e2e-cluster.sh): the process that holds a pod's namespaces, waiting
// for the signal that ends the pod. The cluster has no registry to pull
// registry.k8s.io/pause from, so the project builds its own, as it builds
// its own image (internal/containerimage).
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGTERM, syscall.SIGINT)
	<-ch
}
