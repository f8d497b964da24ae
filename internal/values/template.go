package values

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"text/template"
	"text/template/parse"
)

// The bounds of template expansion. Values are tenant input in the
// controller, and text/template cannot be interrupted: so the constructs
// that run for as long as they like (loops, recursion) are refused
// outright, and what remains runs in time and memory proportional to these
// bounds.
const (
	// MaxTemplateRounds bounds the rounds of reference resolution (a
	// reference may yield a string holding more references), so that a
	// value that refers to itself fails instead of looping.
	MaxTemplateRounds = 10
	// MaxTemplateOutput bounds what one value expands to. A registry url
	// or tag is a line; this is far above any real one.
	MaxTemplateOutput = 64 << 10
	// MaxTemplatesOutput bounds the bytes all the templates of one values
	// set may produce together, the results of print, printf, println,
	// html, js and urlquery included (printf "%01000000d" is a megabyte
	// from a dozen characters).
	MaxTemplatesOutput = 1 << 20
	// MaxTemplateNodes bounds the template actions one values set may
	// parse, every round included: without loops each runs at most once.
	MaxTemplateNodes = 10000
	// MaxTemplateNesting bounds how deep if/with blocks nest.
	MaxTemplateNesting = 20
)

// ErrTemplateBound is wrapped by every refusal of a template for passing a
// bound or using a refused construct.
var ErrTemplateBound = errors.New("values template refused")

// Renderer resolves the {{ .Values.x }} references of one values set, as
// Helm's tpl does, within bounds shared by all its calls (see the
// constants). It is not safe for concurrent use.
type Renderer struct {
	ctx    context.Context
	values Values
	output int // bytes produced so far, by all calls
	nodes  int // template nodes parsed so far
}

// NewRenderer returns a renderer of references against v. Expansion stops,
// with ctx's error, once ctx is done.
func NewRenderer(ctx context.Context, v Values) *Renderer {
	return &Renderer{ctx: ctx, values: v}
}

// Render resolves the references in s, the value at path (named in every
// error). A refusal wraps ErrTemplateBound; a cancellation wraps the
// context's error.
func (r *Renderer) Render(s, path string) (string, error) {
	for range MaxTemplateRounds {
		if err := r.ctx.Err(); err != nil {
			return "", fmt.Errorf("%s: template expansion stopped: %w", path, context.Cause(r.ctx))
		}
		if !strings.Contains(s, "{{") {
			return s, nil
		}
		t, err := template.New(path).Option("missingkey=error").Funcs(r.funcs()).Parse(s)
		if err != nil {
			return "", fmt.Errorf("%s: bad template %q: %w", path, abbreviate(s), err)
		}
		if err := r.admit(t); err != nil {
			return "", fmt.Errorf("%s: %w", path, err)
		}
		out := &boundedWriter{r: r}
		if err := t.Execute(out, map[string]any{"Values": r.values}); err != nil {
			var refused *boundError
			if errors.As(err, &refused) {
				return "", fmt.Errorf("%s: %w", path, refused.err)
			}
			return "", fmt.Errorf("%s: cannot resolve %q: %w", path, abbreviate(s), err)
		}
		s = out.b.String()
	}
	return "", fmt.Errorf("%s: %w: references nest deeper than %d levels (a value refers to itself?)", path, ErrTemplateBound, MaxTemplateRounds)
}

// admit refuses the constructs that can run without end (range, template,
// define, block) and charges the template's nodes to the budget.
func (r *Renderer) admit(t *template.Template) error {
	if len(t.Templates()) > 1 {
		return fmt.Errorf("%w: {{define}} and {{block}} are not allowed in values templates; use {{ .Values.x }} references", ErrTemplateBound)
	}
	var walk func(n parse.Node, depth int) error
	walk = func(n parse.Node, depth int) error {
		if n == nil {
			return nil
		}
		r.nodes++
		if r.nodes > MaxTemplateNodes {
			return fmt.Errorf("%w: the templates of these values hold more than %d actions", ErrTemplateBound, MaxTemplateNodes)
		}
		if depth > MaxTemplateNesting {
			return fmt.Errorf("%w: if/with blocks nest deeper than %d", ErrTemplateBound, MaxTemplateNesting)
		}
		switch n := n.(type) {
		case *parse.RangeNode:
			return fmt.Errorf("%w: {{range}} is not allowed in values templates (loops could run without end); use {{ .Values.x }} references", ErrTemplateBound)
		case *parse.TemplateNode:
			return fmt.Errorf("%w: {{template}} is not allowed in values templates; use {{ .Values.x }} references", ErrTemplateBound)
		case *parse.BreakNode, *parse.ContinueNode:
			return fmt.Errorf("%w: {{break}} and {{continue}} are not allowed in values templates", ErrTemplateBound)
		case *parse.ListNode:
			for _, c := range n.Nodes {
				if err := walk(c, depth); err != nil {
					return err
				}
			}
		case *parse.IfNode:
			return walkBranch(walk, &n.BranchNode, depth)
		case *parse.WithNode:
			return walkBranch(walk, &n.BranchNode, depth)
		case *parse.ActionNode:
			return walk(n.Pipe, depth)
		case *parse.PipeNode:
			for _, c := range n.Cmds {
				if err := walk(c, depth); err != nil {
					return err
				}
			}
		case *parse.CommandNode:
			for _, a := range n.Args {
				if err := walk(a, depth); err != nil {
					return err
				}
			}
		}
		return nil
	}
	return walk(t.Tree.Root, 0)
}

func walkBranch(walk func(parse.Node, int) error, b *parse.BranchNode, depth int) error {
	if err := walk(b.Pipe, depth+1); err != nil {
		return err
	}
	for _, l := range []*parse.ListNode{b.List, b.ElseList} {
		if l == nil {
			continue
		}
		if err := walk(l, depth+1); err != nil {
			return err
		}
	}
	return nil
}

// funcs shadow the builtins that make strings of any length from a few
// characters, so that what they make is charged to the budget.
func (r *Renderer) funcs() template.FuncMap {
	charged := func(s string) (string, error) {
		if err := r.charge(len(s)); err != nil {
			return "", err
		}
		return s, nil
	}
	return template.FuncMap{
		"print":    func(args ...any) (string, error) { return charged(fmt.Sprint(args...)) },
		"println":  func(args ...any) (string, error) { return charged(fmt.Sprintln(args...)) },
		"printf":   func(f string, args ...any) (string, error) { return charged(fmt.Sprintf(f, args...)) },
		"html":     func(args ...any) (string, error) { return charged(template.HTMLEscaper(args...)) },
		"js":       func(args ...any) (string, error) { return charged(template.JSEscaper(args...)) },
		"urlquery": func(args ...any) (string, error) { return charged(template.URLQueryEscaper(args...)) },
	}
}

// charge counts n bytes against the budget of the values set, and stops
// the expansion when the context is done.
func (r *Renderer) charge(n int) error {
	if err := r.ctx.Err(); err != nil {
		return &boundError{fmt.Errorf("template expansion stopped: %w", context.Cause(r.ctx))}
	}
	r.output += n
	if r.output > MaxTemplatesOutput {
		return &boundError{fmt.Errorf("%w: the templates of these values produce more than %d bytes (a value that refers to itself, or a huge printf?)", ErrTemplateBound, MaxTemplatesOutput)}
	}
	return nil
}

// boundError carries a refusal through text/template's error wrapping.
type boundError struct{ err error }

func (e *boundError) Error() string { return e.err.Error() }
func (e *boundError) Unwrap() error { return e.err }

// boundedWriter is the output of one round: at most MaxTemplateOutput
// bytes, each charged to the budget.
type boundedWriter struct {
	r *Renderer
	b strings.Builder
}

func (w *boundedWriter) Write(p []byte) (int, error) {
	if w.b.Len()+len(p) > MaxTemplateOutput {
		return 0, &boundError{fmt.Errorf("%w: expands to more than %d bytes (a value that refers to itself?)", ErrTemplateBound, MaxTemplateOutput)}
	}
	if err := w.r.charge(len(p)); err != nil {
		return 0, err
	}
	return w.b.Write(p)
}

// abbreviate keeps error messages short when a template is long.
func abbreviate(s string) string {
	const max = 200
	if len(s) <= max {
		return s
	}
	return s[:max] + "…"
}
