package testenv

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// allowedSkips are the skips of the tree that are not for a missing tool or
// fixture, by file and function, each with why it may skip in CI too. Any
// other t.Skip, Skipf or SkipNow fails TestSkipsForAMissingToolGoThroughMissing:
// a test that cannot run without a tool or fixture calls Missing, which
// OSIMAGES_REQUIRE_ALL (set by CI) turns into a failure.
var allowedSkips = map[string]string{
	"internal/testenv/missing.go Missing":                                         "the switch itself",
	"internal/testenv/netns_other.go OwnNetwork":                                  "platform: network namespaces are Linux's",
	"internal/testenv/tmpfs.go SmallFS":                                           "privilege: mounting a tmpfs needs root (CAP_SYS_ADMIN)",
	"internal/testenv/tmpfs_other.go SmallFS":                                     "platform: the small file system is a Linux tmpfs",
	"internal/containerimage/image_test.go TestImagePushedToRegistry":             "platform: the image carries a Linux binary built here",
	"internal/containerimage/image_test.go TestBuildRefusesDynamicBinary":         "platform: needs a Linux dynamic executable",
	"internal/containerimage/build_test.go tiny":                                  "platform: the image carries a Linux binary built here",
	"internal/serverio/fifo_test.go TestFilePublisherPublishedDoesNotHangOnAFIFO": "platform: a file system without FIFOs",
	"internal/chart/rbac_test.go TestComponentsRunWithChartRBAC":                  "a subtest that reads what an earlier subtest made, which failed already",
}

func TestSkipsForAMissingToolGoThroughMissing(t *testing.T) {
	root := moduleRoot(t)
	files := 0
	used := map[string]bool{}
	var bare []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if path != root && (name == "testdata" || name == "vendor" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || isModule(path)) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		files++
		found, err := skipsIn(path, nil)
		if err != nil {
			return err
		}
		for _, s := range found {
			key := rel + " " + s.fn
			if _, ok := allowedSkips[key]; ok {
				used[key] = true
				continue
			}
			bare = append(bare, fmt.Sprintf("%s:%d (%s)", rel, s.line, s.fn))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 100 {
		t.Fatalf("found %d Go files under %s: the walk is wrong", files, root)
	}
	if len(bare) > 0 {
		t.Errorf("a test that cannot run without a tool or fixture ends through testenv.Missing(t, why), which %s (set by CI) turns into a failure; a skip for a platform or a privilege is listed in allowedSkips (internal/testenv/missing_test.go) with why CI may skip it too. Skips that are neither:\n%s",
			RequireAllEnv, strings.Join(bare, "\n"))
	}
	var stale []string
	for key := range allowedSkips {
		if !used[key] {
			stale = append(stale, key)
		}
	}
	slices.Sort(stale)
	if len(stale) > 0 {
		t.Errorf("allowedSkips lists skips that are no longer in the tree; remove them:\n%s", strings.Join(stale, "\n"))
	}
}

// TestTheSkipCheckFindsEachSkip: every form of a skip is found, in the
// function that holds it, and a skip written in a string (a test's
// fixture) is not.
func TestTheSkipCheckFindsEachSkip(t *testing.T) {
	src := "package x\n" +
		"import \"testing\"\n" +
		"func TestA(t *testing.T) { t.Skip(\"oras is not installed\") }\n" +
		"func TestB(t *testing.T) { t.Run(\"sub\", func(t *testing.T) { t.Skipf(\"%s\", \"x\") }) }\n" +
		"func helper(tb testing.TB) { tb.SkipNow() }\n" +
		"func BenchmarkC(b *testing.B) { b.Skip() }\n" +
		"func TestD(t *testing.T) { Missing(t, \"why\") }\n" +
		"const fixture = `func TestE(t *testing.T) { t.Skip(\"x\") }`\n"
	got, err := skipsIn(filepath.Join(t.TempDir(), "x.go"), src)
	if err != nil {
		t.Fatal(err)
	}
	var fns []string
	for _, s := range got {
		fns = append(fns, s.fn)
	}
	if want := []string{"TestA", "TestB", "helper", "BenchmarkC"}; !slices.Equal(fns, want) {
		t.Errorf("found skips in %v, want %v", fns, want)
	}
}

type skipCall struct {
	fn   string // the function declared at the top level that holds it
	line int
}

// skipsIn lists the calls of a method Skip, Skipf or SkipNow in the file
// at path (or in src).
func skipsIn(path string, src any) ([]skipCall, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, src, parser.SkipObjectResolution)
	if err != nil {
		return nil, err
	}
	var out []skipCall
	for _, decl := range f.Decls {
		fn, ok := decl.(*ast.FuncDecl)
		if !ok || fn.Body == nil {
			continue
		}
		ast.Inspect(fn.Body, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			if sel, ok := call.Fun.(*ast.SelectorExpr); ok && (sel.Sel.Name == "Skip" || sel.Sel.Name == "Skipf" || sel.Sel.Name == "SkipNow") {
				out = append(out, skipCall{fn.Name.Name, fset.Position(call.Pos()).Line})
			}
			return true
		})
	}
	return out, nil
}

func moduleRoot(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	for {
		if data, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil {
			if !strings.Contains(string(data), "module github.com/sylva-projects/osimages\n") {
				t.Fatalf("%s/go.mod is not the osimages module", dir)
			}
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the package directory")
		}
		dir = parent
	}
}

// isModule says whether dir holds a module of its own (not part of this
// one).
func isModule(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, "go.mod"))
	return err == nil
}
