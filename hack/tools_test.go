// Package hack holds the tests of the scripts of hack/.
package hack

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/sylva-projects/osimages/internal/testenv"
)

// stub is a command that records how it was called, on standard error
// (where tools.sh logs), and does nothing else.
const stub = `#!/bin/sh
echo "RUN $(basename "$0") $*" >&2
case "$(basename "$0") $1 $2" in
"go env GOMODCACHE") echo "$STUB_MODCACHE" ;;
"id -u "*) echo 0 ;;
esac
`

// TestToolsSayWhatTheyInstallFirst runs hack/tools.sh on an empty cache,
// as root with apt-get and without chromium, every installing command
// (go, apt-get) replaced by a stub that records its call: each install
// must come after a line of the script that names what it installs.
func TestToolsSayWhatTheyInstallFirst(t *testing.T) {
	bin := t.TempDir()
	for _, name := range []string{"go", "apt-get", "id"} {
		if err := os.WriteFile(filepath.Join(bin, name), []byte(stub), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// Only the commands the script needs, so that a chromium or a go of
	// this machine is not found.
	for _, name := range []string{"bash", "sh", "grep", "head", "cut", "cat", "sha256sum", "mkdir", "mktemp", "rm", "mv", "dirname", "basename", "awk", "ls"} {
		path, err := exec.LookPath(name)
		if err != nil {
			testenv.Missing(t, "%s is not installed: %v", name, err)
		}
		if err := os.Symlink(path, filepath.Join(bin, name)); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(filepath.Join(bin, "bash"), "tools.sh")
	cmd.Env = []string{"PATH=" + bin, "HOME=" + t.TempDir(), "OSIMAGES_TOOLS_DIR=" + t.TempDir(), "STUB_MODCACHE=" + t.TempDir(), "TMPDIR=" + t.TempDir()}
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("tools.sh: %v\n%s", err, stderr.String())
	}

	// What each installing command installs, and the word its log line
	// must hold.
	installs := []struct {
		call     *regexp.Regexp
		subject  string
		optional bool // only where the machine lacks it
	}{
		{regexp.MustCompile(`^RUN go build .*-o \S*/etcd `), "etcd", false},
		{regexp.MustCompile(`^RUN go build .*-o \S*/kube-apiserver `), "kube-apiserver", false},
		{regexp.MustCompile(`^RUN go install oras\.land/oras/cmd/oras@`), "oras", false},
		{regexp.MustCompile(`^RUN go install github\.com/mikefarah/yq/v4@`), "yq", false},
		{regexp.MustCompile(`^RUN go install github\.com/sigstore/cosign/v3/cmd/cosign@`), "cosign", false},
		{regexp.MustCompile(`^RUN go mod download sigs\.k8s\.io/cluster-api@`), "cluster-api", false},
		{regexp.MustCompile(`^RUN go mod download github\.com/metal3-io/cluster-api-provider-metal3@`), "cluster-api-provider-metal3", false},
		{regexp.MustCompile(`^RUN go mod download$`), "capm3webhook", false},
		{regexp.MustCompile(`^RUN apt-get .*install .*chromium`), "chromium", false},
		{regexp.MustCompile(`^RUN apt-get .*install .*iproute2`), "iproute2", false},
		{regexp.MustCompile(`^RUN apt-get .*install .*ca-certificates`), "ca-certificates", true},
		{regexp.MustCompile(`^RUN apt-get .*install .*python3-ironic`), "python3-ironic", true},
		{regexp.MustCompile(`^RUN apt-get .*install .*python3-pint`), "python3-pint", true},
		{regexp.MustCompile(`^RUN apt-get download .*python3-oslo\.utils=`), "python3-oslo.utils", true},
	}
	seen := map[string]bool{}
	lastLog := ""
	for _, line := range strings.Split(stderr.String(), "\n") {
		if strings.HasPrefix(line, "tools: ") {
			lastLog = line
			continue
		}
		if !strings.HasPrefix(line, "RUN ") || strings.HasPrefix(line, "RUN id ") || strings.HasPrefix(line, "RUN go env ") || strings.HasPrefix(line, "RUN apt-get update") {
			continue
		}
		matched := false
		for _, in := range installs {
			if in.call.MatchString(line) {
				matched, seen[in.subject] = true, true
				if !strings.Contains(lastLog, in.subject) {
					t.Errorf("%q installs %s, but the last line the script wrote before it is %q", line, in.subject, lastLog)
				}
			}
		}
		if !matched {
			t.Errorf("%q: an install this test does not know; add it to the list", line)
		}
	}
	for _, in := range installs {
		if !seen[in.subject] && !in.optional {
			t.Errorf("tools.sh did not install %s on an empty cache:\n%s", in.subject, stderr.String())
		}
	}
}
