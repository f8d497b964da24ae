package exitcode

import (
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/sylva-projects/osimages/"

// testSupport are the packages under internal/ that run only under go
// test: what they write goes to go test's own output.
var testSupport = []string{"internal/testenv"}

// TestTheCLIStaysInTheCLI: exit codes and the process's standard streams
// belong to cmd/osimages. Everywhere else under internal/, code returns
// errors and results, and writes to the writers and loggers it is given,
// so that a package can be run by another command, a controller or a test
// without printing behind its back or deciding how the process ends.
// The renderer returns objects: it imports no Kubernetes client to apply
// them with.
func TestTheCLIStaysInTheCLI(t *testing.T) {
	files := internalFiles(t)
	if len(files) < 50 {
		t.Fatalf("found %d non-test Go files under internal/: the walk is wrong", len(files))
	}
	var found []string
	for _, path := range files {
		for _, v := range cliUses(t, path) {
			found = append(found, path+":"+v)
		}
	}
	if len(found) > 0 {
		t.Errorf("only cmd/osimages (and internal/exitcode) exit, print or choose exit codes; return an error (typed when the command must tell it apart) or a result, and let the command print it and map it to an exit code:\n%s",
			strings.Join(found, "\n"))
	}
}

// TestTheTreeCheckFindsEachUse: each use the tree check forbids is found,
// under any name its package is imported as; what only looks like one is
// not.
func TestTheTreeCheckFindsEachUse(t *testing.T) {
	for _, tc := range []struct {
		src  string
		want int
	}{
		{`import "github.com/sylva-projects/osimages/internal/exitcode"`, 1},
		{`import "os"; var _ = os.Stdout`, 1},
		{`import stdos "os"; func f() { stdos.Stderr.Write(nil) }`, 1},
		{`import "os"; func f() { os.Exit(2) }`, 1},
		{`import "fmt"; func f() { fmt.Println("x"); fmt.Printf("y") }`, 2},
		{`import "log"; func f() { log.Fatal("x") }`, 1},
		{`func f() { println("x") }`, 1},
		{`import "k8s.io/client-go/kubernetes"`, 0}, // only the renderer must not
		{`import ("fmt"; "io"; "os"); func f(w io.Writer) { fmt.Fprintln(w, "x"); _, _ = os.Open("f") }`, 0},
		{`import "log/slog"; func f() { slog.Info("x") }`, 0},
		{`type t struct{ Stdout int }; var os t; var _ = os.Stdout`, 0},
	} {
		path := filepath.Join(t.TempDir(), "x.go")
		got := uses(t, path, "package x\n"+tc.src+"\n", false)
		if len(got) != tc.want {
			t.Errorf("%s: found %q, want %d", tc.src, got, tc.want)
		}
	}
	path := filepath.Join(t.TempDir(), "x.go")
	if got := uses(t, path, "package x\nimport \"sigs.k8s.io/controller-runtime/pkg/client\"\nvar _ client.Client\n", true); len(got) != 1 {
		t.Errorf("a renderer that imports a client: found %q, want it", got)
	}
}

// internalFiles returns the non-test Go files of internal/, from the
// module's root, but internal/exitcode's and test support's.
func internalFiles(t *testing.T) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir("../..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel("../..", path)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if rel != "." && rel != "internal" && !strings.HasPrefix(rel, "internal/") || d.Name() == "testdata" ||
				rel == "internal/exitcode" || slices.Contains(testSupport, rel) {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasPrefix(rel, "internal/") && strings.HasSuffix(rel, ".go") && !strings.HasSuffix(rel, "_test.go") {
			files = append(files, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

func cliUses(t *testing.T, rel string) []string {
	t.Helper()
	return uses(t, filepath.Join("../..", rel), nil, strings.HasPrefix(rel, "internal/capm3/"))
}

// uses lists, as "line: what", the uses in the file at path (or in src)
// of what only the command may use; renderer adds the imports a pure
// renderer has no use for.
func uses(t *testing.T, path string, src any, renderer bool) []string {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, src, 0)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	add := func(pos token.Pos, what string) {
		out = append(out, fmt.Sprintf("%d: %s", fset.Position(pos).Line, what))
	}
	// The name each standard package of interest is imported as.
	names := map[string]string{}
	for _, imp := range f.Imports {
		p, err := strconv.Unquote(imp.Path.Value)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case p == module+"internal/exitcode":
			add(imp.Pos(), "imports internal/exitcode")
		case renderer && (p == module+"internal/kube" || strings.HasPrefix(p, "k8s.io/client-go") || strings.HasPrefix(p, "sigs.k8s.io/controller-runtime")):
			add(imp.Pos(), "the renderer imports "+p+": it returns objects, and the command applies them")
		case p == "os" || p == "fmt" || p == "log":
			name := p
			if imp.Name != nil {
				name = imp.Name.Name
			}
			names[name] = p
		}
	}
	forbidden := map[string][]string{
		"os":  {"Stdout", "Stderr", "Exit"},
		"fmt": {"Print", "Printf", "Println"},
		"log": {"Print", "Printf", "Println", "Fatal", "Fatalf", "Fatalln", "Panic", "Panicf", "Panicln", "SetOutput"},
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.SelectorExpr:
			x, ok := n.X.(*ast.Ident)
			// An identifier that resolves in the file is a variable, not
			// the package.
			if !ok || x.Obj != nil {
				return true
			}
			if p, ok := names[x.Name]; ok && slices.Contains(forbidden[p], n.Sel.Name) {
				add(n.Pos(), p+"."+n.Sel.Name)
			}
		case *ast.CallExpr:
			if id, ok := n.Fun.(*ast.Ident); ok && id.Obj == nil && (id.Name == "print" || id.Name == "println") {
				add(n.Pos(), id.Name)
			}
		}
		return true
	})
	return out
}

// TestOf: the code of an error is that of its first *Error, however
// wrapped; an error without one is a failure.
func TestOf(t *testing.T) {
	plain := errors.New("plain")
	for _, tc := range []struct {
		err  error
		want int
	}{
		{nil, 0},
		{plain, Failure},
		{InputError(plain), Input},
		{FailureError(plain), Failure},
		{fmt.Errorf("context: %w", InputError(plain)), Input},
		{errors.Join(plain, InputError(plain)), Input},
		{FailureError(InputError(plain)), Failure},
	} {
		if got := Of(tc.err); got != tc.want {
			t.Errorf("Of(%v) = %d, want %d", tc.err, got, tc.want)
		}
	}
	if InputError(nil) != nil || FailureError(nil) != nil {
		t.Error("a nil error must stay nil")
	}
}
