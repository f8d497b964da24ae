package controller

import (
	"go/ast"
	"go/parser"
	"go/token"
	"testing"
)

// TestEveryCatalogReasonHasAnOutcome: catalogOutcomes is the one place
// that says what a catalog reason leaves in osimages-status, the event
// and the metrics; a reason declared without a row there would write an
// event of no type and an empty state. The declarations are read from
// the source, so that a new reason is checked without being listed here.
func TestEveryCatalogReasonHasAnOutcome(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "catalog.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	declared := 0
	ast.Inspect(f, func(n ast.Node) bool {
		spec, ok := n.(*ast.ValueSpec)
		if !ok {
			return true
		}
		if typ, named := spec.Type.(*ast.Ident); !named || typ.Name != "catalogReason" {
			return true
		}
		for _, v := range spec.Values {
			lit, _ := v.(*ast.BasicLit)
			declared++
			if lit == nil {
				t.Errorf("a catalogReason is not a literal: %T", v)
				continue
			}
			out, ok := catalogOutcomes[catalogReason(lit.Value[1:len(lit.Value)-1])]
			if !ok || out.eventType == "" {
				t.Errorf("reason %s has no outcome (state, event type, result) in catalogOutcomes", lit.Value)
			}
		}
		return true
	})
	if declared < 5 {
		t.Fatalf("found %d catalog reasons in catalog.go: the walk is wrong", declared)
	}
}
