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
