// Command kube-apiserver is the upstream API server, built from the Go module
// proxy so that envtest has a real apiserver on machines that cannot download
// setup-envtest's prebuilt binaries.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() {
	os.Exit(cli.Run(app.NewAPIServerCommand()))
}
