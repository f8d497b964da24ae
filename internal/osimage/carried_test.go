package osimage

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// The sha256 of an image is parsed once, where it enters (ParseSHA256,
// Image.SHA256, Image.ServedAt, ParseImagePath and this package's document
// parsers), and carried as a SHA256 from there on (issue 25, item 4). These
// tests read the module's own source to keep it so: outside this package,
// no code converts a string into a SHA256, which would give an unchecked
// value the type of a checked one, and no code parses a sha256 only to
// throw the result away, which means the value it checked goes on as a
// string and is parsed again further on.

const osimageImportPath = "github.com/sylva-projects/osimages/internal/osimage"

// checksOnly are the functions allowed to parse a sha256 and drop it: they
// check a document they write, whose sha256 stays a field of that document
// and is never used as a SHA256. Keyed by slash path and function name.
var checksOnly = map[string]bool{
	// The catalog checks each record it publishes against the identity
	// rules, so that it never publishes one that the image server or
	// render would refuse.
	"internal/catalog/plan.go checkIdentity": true,
}

func TestSHA256IsParsedWhereItEntersAndCarried(t *testing.T) {
	root := moduleRoot(t)
	self, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	scanned := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if path != root && (path == self || name == "testdata" || name == "vendor" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || isModule(path)) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		findings, err := misusesOfSHA256(filepath.ToSlash(rel), src)
		if err != nil {
			return err
		}
		for _, f := range findings {
			t.Error(f)
		}
		scanned++
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// The walk must have seen the code that handles sha256s, or it proves
	// nothing.
	if scanned < 50 {
		t.Fatalf("only %d Go files scanned under %s", scanned, root)
	}
}

// TestMisusesOfSHA256AreFound: the scanner of the test above finds each
// way of writing a conversion or a dropped parse, and nothing else.
func TestMisusesOfSHA256AreFound(t *testing.T) {
	src := `package p

import (
	oi "` + osimageImportPath + `"
	. "` + osimageImportPath + `"
)

func f(s string, img oi.Image) {
	_ = oi.SHA256(s)          // cast
	_ = (oi.SHA256)(s)        // cast
	_ = []oi.SHA256{oi.SHA256(s)} // cast
	_ = SHA256(s)             // cast, dot import
	if _, err := oi.ParseSHA256(s); err != nil { // dropped
	}
	_, err := img.SHA256()    // dropped
	oi.ParseSHA256(s)         // dropped
	_, _ = ParseSHA256(s)     // dropped, dot import
	var x oi.SHA256           // a type mention
	x, err = oi.ParseSHA256(s)
	y, _ := img.SHA256()
	_, _, _ = x, y, err
}

func checkIdentity(s string) {
	_, _ = oi.ParseSHA256(s) // allowed here only
}
`
	findings, err := misusesOfSHA256("internal/catalog/plan.go", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	var lines []int
	for _, f := range findings {
		_, rest, _ := strings.Cut(f, ":")
		n, _ := strconv.Atoi(rest[:strings.IndexByte(rest, ':')])
		lines = append(lines, n)
	}
	if want := []int{9, 10, 11, 12, 13, 15, 16, 17}; !slices.Equal(lines, want) {
		t.Errorf("findings on lines %v, want %v:\n%s", lines, want, strings.Join(findings, "\n"))
	}
	if findings, _ := misusesOfSHA256("internal/other/p.go", []byte(src)); len(findings) != 9 {
		t.Errorf("outside the catalog's check, want 9 findings:\n%s", strings.Join(findings, "\n"))
	}
}

// misusesOfSHA256 returns where the Go source src, at path rel in the
// module, converts something into an osimage.SHA256 or drops the result of
// parsing a sha256.
func misusesOfSHA256(rel string, src []byte) ([]string, error) {
	fset := token.NewFileSet()
	file, err := parser.ParseFile(fset, rel, src, parser.SkipObjectResolution)
	if err != nil {
		return nil, err
	}
	name, dot := "", false
	for _, imp := range file.Imports {
		if p, _ := strconv.Unquote(imp.Path.Value); p != osimageImportPath {
			continue
		}
		switch {
		case imp.Name == nil:
			name = "osimage"
		case imp.Name.Name == ".":
			dot = true
		case imp.Name.Name != "_":
			name = imp.Name.Name
		}
	}
	// isOsimage says whether e names the exported identifier id of osimage.
	isOsimage := func(e ast.Expr, id string) bool {
		switch e := ast.Unparen(e).(type) {
		case *ast.SelectorExpr:
			x, ok := e.X.(*ast.Ident)
			return ok && name != "" && x.Name == name && e.Sel.Name == id
		case *ast.Ident:
			return dot && e.Name == id
		}
		return false
	}
	// parses says whether e is a call that parses a sha256: ParseSHA256,
	// or an image's SHA256 method.
	parses := func(e ast.Expr) bool {
		call, ok := ast.Unparen(e).(*ast.CallExpr)
		if !ok {
			return false
		}
		if isOsimage(call.Fun, "ParseSHA256") {
			return true
		}
		sel, ok := ast.Unparen(call.Fun).(*ast.SelectorExpr)
		return ok && sel.Sel.Name == "SHA256" && len(call.Args) == 0 && !isOsimage(sel, "SHA256")
	}
	blank := func(e ast.Expr) bool { id, ok := e.(*ast.Ident); return ok && id.Name == "_" }

	var out []string
	report := func(n ast.Node, what string) {
		out = append(out, fmt.Sprintf("%s: %s", fset.Position(n.Pos()), what))
	}
	for _, decl := range file.Decls {
		allowed := false
		if fn, ok := decl.(*ast.FuncDecl); ok {
			allowed = checksOnly[rel+" "+fn.Name.Name]
		}
		ast.Inspect(decl, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.CallExpr:
				if isOsimage(n.Fun, "SHA256") {
					report(n, "converts into an osimage.SHA256 without parsing: parse the sha256 where it enters (osimage.ParseSHA256, Image.SHA256) and carry the SHA256")
				}
			case *ast.AssignStmt:
				if len(n.Rhs) == 1 && len(n.Lhs) >= 1 && parses(n.Rhs[0]) && blank(n.Lhs[0]) && !allowed {
					report(n, "parses a sha256 and drops it: carry the parsed SHA256 to where the sha256 is used")
				}
			case *ast.ExprStmt:
				if parses(n.X) && !allowed {
					report(n, "parses a sha256 and drops it: carry the parsed SHA256 to where the sha256 is used")
				}
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

// isModule says whether dir holds a module of its own (it is not part of
// this one).
func isModule(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, "go.mod"))
	return err == nil
}
