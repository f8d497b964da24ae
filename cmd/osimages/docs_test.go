package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"
)

// updateDocs rewrites docs/cli.md instead of comparing it: `make docs`.
var updateDocs = flag.Bool("update", false, "rewrite docs/cli.md from the command tree instead of checking it")

const cliDocsPath = "../../docs/cli.md"

// cliDocs renders the command reference from the cobra command tree, so
// that the flags, defaults and help texts it shows are the ones the binary
// has. Every command is one section of one file, and cobra's links between
// command pages become links to those sections.
func cliDocs() ([]byte, error) {
	root := newRootCommand()
	root.DisableAutoGenTag = true // a date would make every run differ
	var buf bytes.Buffer
	buf.WriteString(`<!-- Generated from the cobra commands by TestCLIDocs (cmd/osimages/docs_test.go): do not edit. Regenerate with: make docs -->
# Command reference

Every command of ` + "`osimages`" + `, its flags and their defaults, as ` + "`osimages COMMAND --help`" + ` prints
them. What each command does in depth: the [README](../README.md) links the guides.

`)
	var walk func(c *cobra.Command) error
	walk = func(c *cobra.Command) error {
		if c != root && (!c.IsAvailableCommand() || c.IsAdditionalHelpTopicCommand()) {
			return nil
		}
		// A help text is laid out for a terminal (indented lists, a YAML
		// example): fenced, it reads as --help prints it.
		if c.Long != "" {
			c.Long = "```text\n" + strings.TrimRight(c.Long, "\n") + "\n```"
		}
		if err := doc.GenMarkdownCustom(c, &buf, cliDocsAnchor); err != nil {
			return err
		}
		for _, child := range c.Commands() {
			if err := walk(child); err != nil {
				return err
			}
		}
		return nil
	}
	if err := walk(root); err != nil {
		return nil, err
	}
	return bytes.TrimRight(buf.Bytes(), "\n"), nil
}

// cliDocsAnchor turns cobra's link to a command's own page
// ("osimages_catalog.md") into a link to its section of docs/cli.md.
func cliDocsAnchor(page string) string {
	return "#" + strings.ReplaceAll(strings.TrimSuffix(page, ".md"), "_", "-")
}

// TestCLIDocs checks that docs/cli.md is what the commands say. After a
// change of a command, a flag or a help text, run `make docs` (this test
// with -update) and commit the result.
func TestCLIDocs(t *testing.T) {
	want, err := cliDocs()
	if err != nil {
		t.Fatal(err)
	}
	want = append(want, '\n')
	if *updateDocs || os.Getenv("OSIMAGES_UPDATE_DOCS") != "" {
		if err := os.WriteFile(cliDocsPath, want, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote %s", cliDocsPath)
		return
	}
	got, err := os.ReadFile(cliDocsPath)
	if err != nil {
		t.Fatalf("%v: generate it with `make docs`", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("docs/cli.md does not match the commands (first difference: %s); regenerate it with `make docs` and commit it",
			firstDifference(got, want))
	}
}

// firstDifference names the first line where got and want differ.
func firstDifference(got, want []byte) string {
	g, w := strings.Split(string(got), "\n"), strings.Split(string(want), "\n")
	for i := 0; i < len(g) || i < len(w); i++ {
		var gl, wl string
		if i < len(g) {
			gl = g[i]
		}
		if i < len(w) {
			wl = w[i]
		}
		if gl != wl || i >= len(g) || i >= len(w) {
			return fmt.Sprintf("line %d reads %q, the commands give %q", i+1, gl, wl)
		}
	}
	return "none"
}

// TestDocLinks checks that every relative link of the README, docs/ and
// the chart's README names a file that exists and, with a #fragment, a
// heading of that file: moving a section must not leave a dead link.
func TestDocLinks(t *testing.T) {
	files := []string{"../../README.md"}
	for _, pattern := range []string{"../../docs/*.md", "../../charts/*/README.md"} {
		more, err := filepath.Glob(pattern)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, more...)
	}
	anchors := map[string]map[string]bool{}
	headingsOf := func(path string) map[string]bool {
		if a, ok := anchors[path]; ok {
			return a
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return nil
		}
		a := markdownAnchors(string(data))
		anchors[path] = a
		return a
	}
	checked := 0
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range markdownLinks(string(data)) {
			target, fragment, _ := strings.Cut(l.target, "#")
			path := file
			if target != "" {
				path = filepath.Join(filepath.Dir(file), target)
				if _, err := os.Stat(path); err != nil {
					t.Errorf("%s:%d: link to %s: %v", repoPath(file), l.line, l.target, err)
					continue
				}
			}
			if fragment != "" {
				a := headingsOf(path)
				if a == nil || !a[fragment] {
					t.Errorf("%s:%d: link to %s: %s has no heading with the anchor #%s", repoPath(file), l.line, l.target, repoPath(path), fragment)
				}
			}
			checked++
		}
	}
	if checked == 0 {
		t.Fatal("no relative link found: the link scanner is broken")
	}
}

// repoPath names a file of the checkout from its root.
func repoPath(path string) string {
	if rel, err := filepath.Rel("../..", path); err == nil {
		return rel
	}
	return path
}

type markdownLink struct {
	line   int
	target string
}

var (
	linkPattern = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	codeSpan    = regexp.MustCompile("`[^`]*`")
)

// markdownLinks returns the relative link targets of a Markdown text,
// outside code blocks and code spans.
func markdownLinks(text string) []markdownLink {
	var links []markdownLink
	fenced := false
	for i, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if fenced {
			continue
		}
		for _, m := range linkPattern.FindAllStringSubmatch(codeSpan.ReplaceAllString(line, ""), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			links = append(links, markdownLink{line: i + 1, target: target})
		}
	}
	return links
}

// markdownAnchors returns the anchors GitHub and GitLab give the headings
// of a Markdown text: lower case, punctuation dropped, spaces as hyphens,
// a repeated one suffixed -1, -2...
func markdownAnchors(text string) map[string]bool {
	anchors := map[string]bool{}
	seen := map[string]int{}
	fenced := false
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if fenced || !strings.HasPrefix(line, "#") {
			continue
		}
		title := strings.TrimSpace(strings.TrimLeft(line, "#"))
		var b strings.Builder
		for _, r := range strings.ToLower(title) {
			switch {
			case unicode.IsLetter(r), unicode.IsDigit(r), r == '-', r == '_':
				b.WriteRune(r)
			case r == ' ':
				b.WriteRune('-')
			}
		}
		anchor := b.String()
		if n := seen[anchor]; n > 0 {
			seen[anchor]++
			anchor = fmt.Sprintf("%s-%d", anchor, n)
		} else {
			seen[anchor] = 1
		}
		anchors[anchor] = true
	}
	return anchors
}
