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
	mod := "sigs.k8s.io/cluster-api@" + ClusterAPIVersion
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
	dir := filepath.Join(info.Dir, "core", "config", "crd", "bases")
	if _, err := os.Stat(dir); err != nil {
		return "", fmt.Errorf("%s has no core/config/crd/bases: %w", mod, err)
	}
	return dir, nil
}
