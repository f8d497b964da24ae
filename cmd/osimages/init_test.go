package main

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// maxOwnInitAllocs bounds the allocations of each of osimages' own package
// inits. Go runs the init of every package linked into the binary before
// any command starts, so whatever a package builds at init (a parsed
// template, a compiled regexp, a scheme) every command pays for, including
// those that never use it: build such values at their first use
// (sync.OnceValue) instead.
const maxOwnInitAllocs = 32

// Every init of osimages' own packages is cheap, as GODEBUG=inittrace=1
// reports it for the cheapest command. A count of allocations, not a time:
// it does not depend on the machine's load.
func TestOwnPackageInitsAreCheap(t *testing.T) {
	cmd := exec.Command(binary, "--help")
	cmd.Env = append(os.Environ(), "GODEBUG=inittrace=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("osimages --help: %v\n%s", err, stderr.String())
	}
	// init github.com/x/y @0.5 ms, 0.01 ms clock, 840 bytes, 6 allocs
	line := regexp.MustCompile(`^init (\S+) @.*, (\d+) bytes, (\d+) allocs$`)
	own := 0
	sc := bufio.NewScanner(&stderr)
	for sc.Scan() {
		m := line.FindStringSubmatch(sc.Text())
		if m == nil || !strings.HasPrefix(m[1], "github.com/sylva-projects/osimages/") {
			continue
		}
		own++
		if allocs, _ := strconv.Atoi(m[3]); allocs > maxOwnInitAllocs {
			t.Errorf("package %s allocates %s times (%s bytes) at init, at most %d allowed: every command pays for it; build the value at its first use (sync.OnceValue)",
				m[1], m[3], m[2], maxOwnInitAllocs)
		}
	}
	if own == 0 {
		t.Fatalf("GODEBUG=inittrace=1 reported no init of osimages' packages: the format changed, fix the test\n%s", stderr.String())
	}
}

// The binary does not link client-go's clientset of every API group, nor
// its informer factory: each brings the typed client, apply
// configurations, informers and listers of all ~50 API groups (18 MB of
// the production binary, 4 MiB more idle RSS for every command), where osimages uses
// four groups (kube.Client, kube.NewInformer). A symbol check, not a
// go list one: client-go's leaderelection imports both packages, but only
// a call makes the linker keep them.
func TestBinaryHasNoFullClientset(t *testing.T) {
	out, err := exec.Command("go", "tool", "nm", binary).Output()
	if err != nil {
		t.Fatalf("go tool nm %s: %v", binary, err)
	}
	if !bytes.Contains(out, []byte(" main.main\n")) {
		t.Fatalf("go tool nm lists no main.main: the binary has no symbol table, and this test would prove nothing")
	}
	banned := regexp.MustCompile(`k8s\.io/client-go/kubernetes\.NewForConfig|k8s\.io/client-go/informers\.NewSharedInformerFactory`)
	seen := map[string]bool{}
	for _, sym := range banned.FindAll(out, -1) {
		seen[string(sym)] = true
	}
	for sym := range seen {
		t.Errorf("the binary links %s: build kube.NewClient and kube.NewInformer instead, which link only the API groups osimages uses", sym)
	}
}
