package main

import "github.com/spf13/pflag"

// addRegistryFlags adds the flags of every command that talks to OCI
// registries.
func addRegistryFlags(f *pflag.FlagSet, caFile, registryConfig *string) {
	f.StringVar(caFile, "ca-file", "", "PEM file of CA certificates to trust for registries, besides the system ones")
	f.StringVar(registryConfig, "registry-config", "", "Docker config.json with registry credentials (default $DOCKER_CONFIG/config.json or ~/.docker/config.json)")
}
