package values

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// renderWithin renders s and fails the test when that takes longer than a
// loaded machine could explain: the hostile cases ran for minutes, or
// until the process ran out of memory, before the bounds.
func renderWithin(t *testing.T, ctx context.Context, s string, v Values) error {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		_, err := NewRenderer(ctx, v).Render(s, "os_images_oci_registries.evil.url")
		done <- err
	}()
	select {
	case err := <-done:
		return err
	case <-time.After(20 * time.Second):
		t.Fatalf("rendering %.60q did not end within 20s", s)
		return nil
	}
}

func TestRenderBoundsHostileTemplates(t *testing.T) {
	selfRef := strings.Repeat("{{ .Values.a }}", 10)
	nested := strings.Repeat("{{range .Values.list}}", 8) + "x" + strings.Repeat("{{end}}", 8)
	list := make([]any, 100)
	for i := range list {
		list[i] = i
	}
	for _, tc := range []struct {
		name, tmpl string
		values     Values
		want       string
	}{
		// The two cases: 1.2 GB then a crash, and 13 minutes.
		{"self reference repeated 10 times", "{{ .Values.a }}", Values{"a": selfRef}, "expands to more than"},
		{"8 nested range over 100 items", nested, Values{"list": list}, "{{range}} is not allowed"},
		{"three nested range 100000", "{{range 100000}}{{range 100000}}{{range 100000}}{{end}}{{end}}{{end}}", nil, "{{range}} is not allowed"},
		{"printf of a megabyte", `{{printf "%01000000d" 0}}`, nil, "expands to more than"},
		{"printf results never written", strings.Repeat(`{{$x := printf "%01000000d" 0}}`, 100), nil, "produce more than"},
		{"recursion through define", `{{define "x"}}{{template "x" .}}{{template "x" .}}{{end}}{{template "x" .}}`, nil, "not allowed"},
		{"block", `{{block "x" .}}a{{end}}`, nil, "not allowed"},
		{"thousands of actions", strings.Repeat("{{ .Values.b }}", MaxTemplateNodes), Values{"b": ""}, "more than 10000 actions"},
		{"deep nesting", strings.Repeat("{{if true}}", 50) + strings.Repeat("{{end}}", 50), nil, "nest deeper than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := renderWithin(t, context.Background(), tc.tmpl, tc.values)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "os_images_oci_registries.evil.url: ") || !errors.Is(err, ErrTemplateBound) {
				t.Errorf("want an error naming the value and %q, got %v", tc.want, err)
			}
		})
	}
}

func TestRenderBudgetIsSharedByTheValuesSet(t *testing.T) {
	// Each value alone is within bounds; together they are not.
	v := Values{"big": strings.Repeat("x", MaxTemplateOutput-1)}
	r := NewRenderer(context.Background(), v)
	var err error
	for i := 0; i < 2*MaxTemplatesOutput/MaxTemplateOutput && err == nil; i++ {
		_, err = r.Render("{{ .Values.big }}", "os_images_oci_registries.r.url")
	}
	if !errors.Is(err, ErrTemplateBound) || !strings.Contains(err.Error(), "produce more than") {
		t.Errorf("the budget of a values set was not enforced across values: %v", err)
	}
}

func TestRenderStopsWhenCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := renderWithin(t, ctx, "{{ .Values.a }}", Values{"a": "b"})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("want the cancellation, got %v", err)
	}
	// A legitimate template still renders, with the functions it may use.
	got, err := NewRenderer(context.Background(), Values{"r": "oci://r", "v": map[string]any{"t": "0.7.6"}}).
		Render(`{{ .Values.r }}/dib:{{ with .Values.v }}{{ .t }}{{ end }}{{ if eq .Values.r "x" }}no{{ else }}{{ printf "-%s" "ok" }}{{ end }}`, "p")
	if err != nil || got != "oci://r/dib:0.7.6-ok" {
		t.Errorf("got %q, %v", got, err)
	}
}
