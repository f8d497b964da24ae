package testenv

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// ClusterAPIVersion is the sigs.k8s.io/cluster-api module whose core CRDs
// (Cluster, Machine, MachineDeployment...) tests install next to Metal3's.
// hack/tools.sh downloads it, so that tests find it in the module cache.
const ClusterAPIVersion = "v1.14.2"

// ClusterAPICRDs returns the folder of Cluster API's core CRDs, read from the
// module as the Go module proxy serves it (through the module cache): the
// YAML is not copied into this repository.
func ClusterAPICRDs() (string, error) {
	return moduleDir("sigs.k8s.io/cluster-api@"+ClusterAPIVersion, filepath.Join("core", "config", "crd", "bases"))
}

// CAPM3RefusingOCI is the last release of Cluster API Provider Metal3 that
// refuses an oci:// image without a checksum (its CRD requires
// image.checksum). hack/tools.sh downloads it, so that tests find it in the
// module cache. The first release that accepts it, v1.14.0-rc.0, is not on
// the Go module proxy (403); its Metal3MachineTemplate CRD is byte for byte
// the one of shared/crds/metal3 (CAPM3 main at 2f6d76b8), which tests use
// in its place.
const CAPM3RefusingOCI = "v1.13.2"

// CAPM3CRDs returns the folder of the CRDs of the CAPM3 release version, read
// from the module github.com/metal3-io/cluster-api-provider-metal3 in the Go
// module cache, as ClusterAPICRDs does.
func CAPM3CRDs(version string) (string, error) {
	return moduleDir("github.com/metal3-io/cluster-api-provider-metal3@"+version, filepath.Join("config", "crd", "bases"))
}

// moduleDir downloads mod (a no-op when the module cache has it) and returns
// the folder sub of it.
func moduleDir(mod, sub string) (string, error) {
	cmd := exec.Command("go", "mod", "download", "-json", mod)
	// Outside any module, so that this module's go.mod is neither read nor
	// changed by the download.
	cmd.Dir = os.TempDir()
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod")
	out, err := cmd.Output()
	var info struct{ Dir, Error string }
	if jerr := json.Unmarshal(out, &info); jerr != nil || info.Error != "" || err != nil {
		return "", fmt.Errorf("go mod download %s (run hack/tools.sh on a machine that reaches the Go module proxy): %v %s", mod, err, info.Error)
	}
	dir := filepath.Join(info.Dir, sub)
	if _, err := os.Stat(dir); err != nil {
		return "", fmt.Errorf("%s has no %s: %w", mod, sub, err)
	}
	return dir, nil
}
