package main

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestLayoutTableMatchesTheTree: every Go package under cmd/ and internal/
// has a row in docs/development.md's layout table and a package doc
// comment, and every row names a directory that exists, so that the table
// a newcomer reads is the tree they find.
func TestLayoutTableMatchesTheTree(t *testing.T) {
	const root = "../.."
	doc, err := os.ReadFile(filepath.Join(root, "docs/development.md"))
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile(`(?m)^\| \[([^\]]+)\]\(\.\./([^)]+)\) \|`)
	listed := map[string]bool{}
	for _, m := range row.FindAllStringSubmatch(string(doc), -1) {
		if m[1] != m[2] {
			t.Errorf("the layout row %q links to ../%s", m[1], m[2])
		}
		listed[m[1]] = true
		if _, err := os.Stat(filepath.Join(root, m[1])); err != nil {
			t.Errorf("the layout table lists %s, which does not exist: %v", m[1], err)
		}
	}
	var packages []string
	for _, top := range []string{"cmd", "internal"} {
		err := filepath.WalkDir(filepath.Join(root, top), func(path string, d fs.DirEntry, err error) error {
			if err != nil || !d.IsDir() {
				return err
			}
			goFiles, _ := filepath.Glob(filepath.Join(path, "*.go"))
			goFiles = slices.DeleteFunc(goFiles, func(f string) bool { return strings.HasSuffix(f, "_test.go") })
			if len(goFiles) == 0 {
				return nil
			}
			rel, _ := filepath.Rel(root, path)
			packages = append(packages, rel)
			if !hasPackageDoc(t, goFiles) {
				t.Errorf("package %s has no doc comment (// Package %s ... or // Command ...)", rel, filepath.Base(rel))
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range packages {
		if !listed[p] {
			t.Errorf("package %s has no row in docs/development.md's layout table", p)
		}
	}
	if len(packages) < 20 {
		t.Fatalf("found only %d packages: is the walk from the repository's root?", len(packages))
	}
}

func hasPackageDoc(t *testing.T, files []string) bool {
	t.Helper()
	fset := token.NewFileSet()
	for _, f := range files {
		parsed, err := parser.ParseFile(fset, f, nil, parser.PackageClauseOnly|parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		if parsed.Doc != nil && strings.TrimSpace(parsed.Doc.Text()) != "" {
			return true
		}
	}
	return false
}

// TestPackagesDependOnlyOnTheirIdeas: a pure package does not drag in
// what its idea has no use for, and a package takes an identity rule from
// the package that holds the identities, not from a face that uses them.
// Each rule is checked against the whole closure go list computes (with
// the package's tests when they must keep it too), so that an import
// through a third package breaks it as well.
func TestPackagesDependOnlyOnTheirIdeas(t *testing.T) {
	const mod = "github.com/sylva-projects/osimages/"
	for _, rule := range []struct {
		pkg, without, why string
		tests             bool
	}{
		{"internal/imagelife", "k8s.io/", "the image's lifecycle is a pure function; Phase lives there, and the replica wire imports it", true},
		{"internal/capm3", "internal/ocidist", "the manifest an oci:// URL pins is an identity rule of internal/osimage; ocidist is the server's /v2/ handler", true},
		// Its tests run the real check against the copies it writes.
		{"internal/propagate", "internal/fleet", "osimages-status is a document of internal/osimage; fleet is the check that writes it", false},
	} {
		args := []string{"list", "-deps"}
		if rule.tests {
			args = append(args, "-test")
		}
		out, err := exec.Command("go", append(args, "../../"+rule.pkg)...).CombinedOutput()
		if err != nil {
			t.Fatalf("go list -deps %s: %v\n%s", rule.pkg, err, out)
		}
		deps := strings.Split(strings.TrimSpace(string(out)), "\n")
		if !slices.Contains(deps, mod+rule.pkg) {
			t.Fatalf("go list -deps %s does not list the package itself: %q", rule.pkg, deps)
		}
		var found []string
		for _, d := range deps {
			if strings.HasPrefix(d, rule.without) || strings.HasPrefix(d, mod+rule.without) {
				found = append(found, d)
			}
		}
		if len(found) > 0 {
			t.Errorf("%s depends on %d package(s) of %s (%s): %s", rule.pkg, len(found), rule.without, rule.why, strings.Join(found[:min(len(found), 5)], ", "))
		}
	}
}
