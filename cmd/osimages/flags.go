package main

import (
	"github.com/spf13/pflag"

	"github.com/sylva-projects/osimages/internal/oci"
)

// addRegistryFlags adds the flags of every command that talks to OCI
// registries.
func addRegistryFlags(f *pflag.FlagSet, o *oci.Options) {
	f.StringVar(&o.CAFile, "ca-file", "", "PEM file of CA certificates to trust for registries, besides the system ones")
	f.StringVar(&o.RegistryConfig, "registry-config", "", "Docker config.json with registry credentials (default $DOCKER_CONFIG/config.json or ~/.docker/config.json)")
}

// addKubeconfigFlag adds --kubeconfig.
func addKubeconfigFlag(f *pflag.FlagSet, kubeconfig *string) {
	f.StringVar(kubeconfig, "kubeconfig", "", "kubeconfig file (default $KUBECONFIG, ~/.kube/config or in-cluster)")
}
