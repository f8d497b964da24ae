package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sylva-projects/osimages/internal/testenv"
)

// goTestJSON runs the real `go test -json` over a module made of files,
// and returns its standard output.
func goTestJSON(t *testing.T, files map[string]string) []byte {
	t.Helper()
	dir := t.TempDir()
	files["go.mod"] = "module sample\n\ngo 1.24\n"
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command("go", "test", "-count=1", "-json", "./...")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if _, failed := err.(*exec.ExitError); err != nil && !failed {
		t.Fatalf("go test: %v\n%s", err, stderr.String())
	}
	return out
}

const sampleTests = `package sample

import "testing"

func TestPasses(t *testing.T) { t.Log("quiet when it passes") }

func TestNeedsATool(t *testing.T) {
	t.Log("looking for the tool")
	t.Skip("chromium is not installed: the status page test needs it")
}

func TestSkipsOnTwoLines(t *testing.T) { t.Skipf("first line\nsecond line") }

func TestFails(t *testing.T) {
	t.Log("what it saw")
	t.Error("what was wrong")
}

func TestParent(t *testing.T) {
	t.Run("skipped", func(t *testing.T) { t.Skip("a subtest's reason") })
	t.Run("passes", func(t *testing.T) {})
}
`

func TestReportListsSkipsAndFailures(t *testing.T) {
	in := goTestJSON(t, map[string]string{"sample_test.go": sampleTests})
	var out bytes.Buffer
	ok, err := report(bytes.NewReader(in), &out, false)
	if err != nil {
		t.Fatal(err)
	}
	if ok {
		t.Error("report says everything passed, but TestFails failed")
	}
	got := out.String()
	for _, want := range []string{
		"--- FAIL: TestFails", "what it saw", "what was wrong", "FAIL\tsample\t",
		"3 tests skipped (they did not run):\n",
		"SKIP sample TestNeedsATool: chromium is not installed: the status page test needs it\n",
		"SKIP sample TestSkipsOnTwoLines: first line second line\n",
		"SKIP sample TestParent/skipped: a subtest's reason\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("the report lacks %q:\n%s", want, got)
		}
	}
	// The skips come last, after every result.
	if strings.LastIndex(got, "FAIL\tsample") > strings.Index(got, "tests skipped") {
		t.Errorf("the skips are not at the end:\n%s", got)
	}
	for _, noise := range []string{"=== RUN", "quiet when it passes", "looking for the tool", "--- PASS"} {
		if strings.Contains(got, noise) {
			t.Errorf("the report shows %q, which go test shows only with -v:\n%s", noise, got)
		}
	}
}

func TestReportOfAPassingRun(t *testing.T) {
	in := goTestJSON(t, map[string]string{"sample_test.go": "package sample\n\nimport \"testing\"\n\nfunc TestPasses(t *testing.T) {}\n"})
	var out bytes.Buffer
	ok, err := report(bytes.NewReader(in), &out, false)
	if err != nil || !ok {
		t.Fatalf("a passing run: ok %v, %v\n%s", ok, err, out.String())
	}
	if got := out.String(); !strings.Contains(got, "ok  \tsample\t") || !strings.Contains(got, "no test skipped") {
		t.Errorf("the report:\n%s", got)
	}
}

func TestReportFailsBuildsAndCutInput(t *testing.T) {
	in := goTestJSON(t, map[string]string{"sample_test.go": "package sample\n\nfunc broken( {\n"})
	var out bytes.Buffer
	if ok, _ := report(bytes.NewReader(in), &out, false); ok || !strings.Contains(out.String(), "sample_test.go:3") {
		t.Errorf("a build failure: ok %v\n%s", ok, out.String())
	}
	// A run cut before its package's result (go test killed) is no
	// success.
	in = goTestJSON(t, map[string]string{"sample_test.go": "package sample\n\nimport \"testing\"\n\nfunc TestPasses(t *testing.T) {}\n"})
	cut := in[:bytes.Index(in, []byte(`"Action":"pass","Package":"sample","Test":"TestPasses"`))]
	cut = cut[:bytes.LastIndexByte(cut, '\n')+1]
	out.Reset()
	if ok, _ := report(bytes.NewReader(cut), &out, false); ok || !strings.Contains(out.String(), "no result for sample") {
		t.Errorf("a cut run: ok %v\n%s", ok, out.String())
	}
}

// With OSIMAGES_REQUIRE_ALL set, a skip for a missing tool or fixture (the
// ones testenv.Missing marks) fails the run; a skip for a platform does not.
func TestReportFailsMissingToolsWhenAllAreRequired(t *testing.T) {
	in := goTestJSON(t, map[string]string{"sample_test.go": `package sample

import "testing"

func TestPasses(t *testing.T) {}

func TestNeedsATool(t *testing.T) { t.Skip("oras is not installed ` + missingMark + `") }

func TestNeedsLinux(t *testing.T) { t.Skip("the image carries a Linux binary") }
`})
	var out bytes.Buffer
	if ok, err := report(bytes.NewReader(in), &out, false); err != nil || !ok {
		t.Errorf("without the switch, skips are listed and the run passes: ok %v, %v\n%s", ok, err, out.String())
	}
	out.Reset()
	ok, err := report(bytes.NewReader(in), &out, true)
	if err != nil || ok {
		t.Errorf("with the switch, a skip for a missing tool fails the run: ok %v, %v\n%s", ok, err, out.String())
	}
	if got := out.String(); !strings.Contains(got, "OSIMAGES_REQUIRE_ALL is set, yet 1 of these tests skipped for a missing tool") ||
		!strings.Contains(got, "SKIP sample TestNeedsLinux: the image carries a Linux binary\n") {
		t.Errorf("the report:\n%s", got)
	}
	in = goTestJSON(t, map[string]string{"sample_test.go": "package sample\n\nimport \"testing\"\n\nfunc TestNeedsLinux(t *testing.T) { t.Skip(\"linux only\") }\n"})
	out.Reset()
	if ok, err := report(bytes.NewReader(in), &out, true); err != nil || !ok {
		t.Errorf("with the switch, a skip for a platform passes: ok %v, %v\n%s", ok, err, out.String())
	}
}

// The report knows the switch and the mark by the same text as testenv.
func TestReportKnowsTestenvsMark(t *testing.T) {
	if requireAllEnv != testenv.RequireAllEnv || missingMark != testenv.MissingMark {
		t.Errorf("testreport has %q and %q, testenv %q and %q: write testenv's here", requireAllEnv, missingMark, testenv.RequireAllEnv, testenv.MissingMark)
	}
}
