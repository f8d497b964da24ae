// Command testreport reads `go test -json` on standard input and writes what
// `go test` writes without -json (each package's result, and the output of
// every failed test), then, at the end, every skipped test with its reason:
// a skip is a test that did not run, and `make test` must say so rather
// than let it pass as a success. It exits 1 when a test, a package or a
// build failed, or when its input ends without a package result, and,
// when OSIMAGES_REQUIRE_ALL is set (CI), when a test skipped for a missing
// tool or fixture (testenv.Missing marks those skips).
//
//	go test -json ./... | go run ./hack/testreport
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
)

func main() {
	ok, err := report(os.Stdin, os.Stdout, os.Getenv(requireAllEnv) != "")
	if err != nil {
		fmt.Fprintln(os.Stderr, "testreport:", err)
		os.Exit(1)
	}
	if !ok {
		os.Exit(1)
	}
}

// requireAllEnv and missingMark are testenv.RequireAllEnv and
// testenv.MissingMark (the test checks they agree), written out so that
// this command does not link the test environment.
const (
	requireAllEnv = "OSIMAGES_REQUIRE_ALL"
	missingMark   = "[missing: OSIMAGES_REQUIRE_ALL makes this skip a failure]"
)

// event is one line of `go test -json` (cmd/test2json).
type event struct {
	Action     string
	Package    string
	Test       string
	Output     string
	ImportPath string
}

// test is the output of one test, kept until it ends.
type test struct {
	lines  []string
	header string // its "--- FAIL" line
}

// skip is a skipped test and why.
type skip struct{ pkg, test, reason string }

// framing lines say that a test runs; without -json go test does not
// print them.
var framing = regexp.MustCompile(`^\s*=== (RUN|PAUSE|CONT|NAME)\b`)

// message starts a line that t.Log, t.Skip or t.Error wrote ("    x_test.go:12: ...").
var message = regexp.MustCompile(`^\s+\S+\.go:\d+: `)

// report copies the results of in to out, the skips last, and says
// whether everything passed; with requireAll, a skip for a missing tool or
// fixture is a failure of the run.
func report(in io.Reader, out io.Writer, requireAll bool) (bool, error) {
	w := bufio.NewWriter(out)
	defer w.Flush()
	var (
		tests   = map[[2]string]*test{}
		skips   []skip
		failed  bool
		started = map[string]bool{} // packages without a result yet
	)
	sc := bufio.NewScanner(in)
	sc.Buffer(nil, 64<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil {
			// Not an event: go's own messages, passed through.
			fmt.Fprintf(w, "%s\n", line)
			continue
		}
		key := [2]string{e.Package, e.Test}
		switch {
		case e.Action == "build-output":
			fmt.Fprint(w, e.Output)
		case e.Action == "build-fail":
			failed = true
		case e.Test == "" && e.Action == "start":
			started[e.Package] = true
		case e.Test == "" && e.Action == "output":
			if e.Output != "PASS\n" {
				fmt.Fprint(w, e.Output)
			}
		case e.Test == "" && (e.Action == "pass" || e.Action == "fail" || e.Action == "skip"):
			delete(started, e.Package)
			if e.Action == "fail" {
				failed = true
				// A test still open when its package failed was running
				// when the binary died (a panic, a timeout): its output
				// says why.
				var open [][2]string
				for k := range tests {
					if k[0] == e.Package {
						open = append(open, k)
					}
				}
				slices.SortFunc(open, func(a, b [2]string) int { return strings.Compare(a[1], b[1]) })
				for _, k := range open {
					printTest(w, tests[k])
				}
			}
			for k := range tests {
				if k[0] == e.Package {
					delete(tests, k)
				}
			}
		case e.Action == "output":
			t := tests[key]
			if t == nil {
				t = &test{}
				tests[key] = t
			}
			switch s := e.Output; {
			case framing.MatchString(s):
			case strings.HasPrefix(strings.TrimSpace(s), "--- "):
				t.header = s
			default:
				t.lines = append(t.lines, s)
			}
		case e.Action == "fail":
			failed = true
			printTest(w, tests[key])
			delete(tests, key)
		case e.Action == "skip":
			reason := "(no reason given)"
			if t := tests[key]; t != nil {
				reason = skipReason(t.lines)
			}
			skips = append(skips, skip{e.Package, e.Test, reason})
			delete(tests, key)
		case e.Action == "pass":
			delete(tests, key)
		}
	}
	if err := sc.Err(); err != nil {
		return false, err
	}
	if len(started) > 0 {
		failed = true
		fmt.Fprintf(w, "testreport: no result for %s: the input ended early\n", strings.Join(slices.Sorted(maps.Keys(started)), ", "))
	}
	if len(skips) == 0 {
		fmt.Fprintln(w, "\nno test skipped")
	} else {
		fmt.Fprintf(w, "\n%d tests skipped (they did not run):\n", len(skips))
		for _, s := range skips {
			fmt.Fprintf(w, "SKIP %s %s: %s\n", s.pkg, s.test, s.reason)
		}
	}
	if requireAll {
		missing := 0
		for _, s := range skips {
			if strings.Contains(s.reason, missingMark) {
				missing++
			}
		}
		if missing > 0 {
			failed = true
			fmt.Fprintf(w, "testreport: %s is set, yet %d of these tests skipped for a missing tool or fixture (the skips that say %q): install the tools (hack/tools.sh, as root) and put shared/ beside the checkout, or find why the switch did not reach the test\n", requireAllEnv, missing, missingMark)
		}
	}
	return !failed, nil
}

func printTest(w io.Writer, t *test) {
	if t == nil {
		return
	}
	fmt.Fprint(w, t.header)
	for _, l := range t.lines {
		fmt.Fprint(w, l)
	}
}

// skipReason is the last message the test wrote before it skipped: the
// one t.Skip wrote, its continuation lines joined.
func skipReason(lines []string) string {
	start := -1
	for i, l := range lines {
		if message.MatchString(l) {
			start = i
		}
	}
	if start < 0 {
		return "(no reason given)"
	}
	first := message.ReplaceAllString(lines[start], "")
	parts := []string{strings.TrimSpace(first)}
	for _, l := range lines[start+1:] {
		parts = append(parts, strings.TrimSpace(l))
	}
	return strings.Join(parts, " ")
}
