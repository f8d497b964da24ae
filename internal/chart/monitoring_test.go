package chart

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

// alertNames are the alerts the chart promises (README, "Monitoring").
var alertNames = []string{
	"OSImagesClusterImageNotServed", "OSImagesClusterImageNotAvailable", "OSImagesDownloadFailing",
	"OSImagesDataVolumeNearlyFull", "OSImagesPropagationLagging", "OSImagesPropagationSourceMissing",
	"OSImagesCatalogFailing", "OSImagesServerWaitingForCatalog",
}

func renderMonitoring(t *testing.T) *Rendered {
	t.Helper()
	vals, err := LoadValues([]byte(`
monitoring: {serviceMonitor: {enabled: true}, prometheusRule: {enabled: true}, grafanaDashboard: {enabled: true}}
server: {tlsSecret: tls}
propagation: {enabled: true}
controller: {propagate: false}
`))
	if err != nil {
		t.Fatal(err)
	}
	r, err := Render(chartDir, Release{Name: "osimages", Namespace: "sylva-system"}, vals)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// strictDecode decodes obj into out, refusing fields out does not know: a
// misspelt field of a ServiceMonitor is silently dropped by the operator.
func strictDecode(t *testing.T, obj *unstructured.Unstructured, out any) {
	t.Helper()
	b, err := json.Marshal(obj.Object)
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(out); err != nil {
		t.Errorf("%s %s is not a valid %s: %v", obj.GetKind(), obj.GetName(), obj.GetKind(), err)
	}
}

// alertRules parses the PrometheusRule's spec with Prometheus's own rule
// parser, as `promtool check rules` does, and returns each alert's
// expression.
func alertRules(t *testing.T, r *Rendered) map[string]string {
	t.Helper()
	rule := r.Find("PrometheusRule", "osimages")
	if rule == nil {
		t.Fatal("no PrometheusRule")
	}
	var typed monitoringv1.PrometheusRule
	strictDecode(t, rule, &typed)
	spec, err := yaml.Marshal(rule.Object["spec"])
	if err != nil {
		t.Fatal(err)
	}
	groups, errs := rulefmt.Parse(spec, false, model.UTF8Validation, parser.NewParser(parser.Options{}), nil)
	for _, err := range errs {
		t.Errorf("Prometheus refuses the rules: %v", err)
	}
	if groups == nil {
		t.FailNow()
	}
	exprs := map[string]string{}
	for _, g := range groups.Groups {
		for _, rl := range g.Rules {
			exprs[rl.Alert] = rl.Expr
			if rl.For == 0 && rl.Alert != "" {
				t.Errorf("%s fires at the first evaluation (no for)", rl.Alert)
			}
			if rl.Labels["severity"] == "" || rl.Annotations["summary"] == "" || rl.Annotations["description"] == "" {
				t.Errorf("%s lacks a severity, summary or description", rl.Alert)
			}
		}
	}
	if got := slices.Sorted(maps.Keys(exprs)); !slices.Equal(got, slices.Sorted(slices.Values(alertNames))) {
		t.Errorf("alerts %v, want %v", got, alertNames)
	}
	return exprs
}

// dashboardExprs returns the PromQL expressions of the dashboard's panels.
func dashboardExprs(t *testing.T, r *Rendered) map[string]string {
	t.Helper()
	cm := r.Find("ConfigMap", "osimages-dashboard")
	if cm == nil {
		t.Fatal("no dashboard ConfigMap")
	}
	doc, _, _ := unstructured.NestedString(cm.Object, "data", "osimages.json")
	var dash struct {
		Title  string `json:"title"`
		UID    string `json:"uid"`
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal([]byte(doc), &dash); err != nil {
		t.Fatalf("the dashboard is not JSON: %v", err)
	}
	if dash.UID == "" || len(dash.Panels) == 0 {
		t.Fatalf("dashboard %q has no uid or no panels", dash.Title)
	}
	exprs := map[string]string{}
	for _, p := range dash.Panels {
		for i, tg := range p.Targets {
			exprs[fmt.Sprintf("panel %q target %d", p.Title, i)] = tg.Expr
		}
	}
	return exprs
}

// metricNames returns the metric names expr reads, failing on an expression
// Prometheus cannot parse.
func metricNames(t *testing.T, what, expr string) []string {
	t.Helper()
	e, err := parser.NewParser(parser.Options{}).ParseExpr(expr)
	if err != nil {
		t.Errorf("%s: %q does not parse: %v", what, expr, err)
		return nil
	}
	var names []string
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		if vs, ok := n.(*parser.VectorSelector); ok {
			names = append(names, vs.Name)
		}
		return nil
	})
	return names
}

// TestMonitoringObjects: the ServiceMonitors and the PrometheusRule are
// valid objects of the Prometheus Operator's own types, the rules pass
// Prometheus's rule parser, and every expression of the rules and the
// dashboard parses and reads only osimages metrics. That those metrics are
// really exported is proven by TestComponentsRunWithChartRBAC, which scrapes
// the running components.
func TestMonitoringObjects(t *testing.T) {
	r := renderMonitoring(t)
	monitors := 0
	for _, o := range r.Objects {
		if o.GetKind() == "ServiceMonitor" {
			monitors++
			var sm monitoringv1.ServiceMonitor
			strictDecode(t, o, &sm)
			if len(sm.Spec.Endpoints) != 1 || sm.Spec.Endpoints[0].Port == "" {
				t.Errorf("ServiceMonitor %s endpoints %+v", o.GetName(), sm.Spec.Endpoints)
			}
		}
	}
	if monitors != 3 {
		t.Errorf("%d ServiceMonitors, want the server's, the controller's and propagation's", monitors)
	}
	all := alertRules(t, r)
	maps.Copy(all, dashboardExprs(t, r))
	osimagesMetric := regexp.MustCompile(`^osimages_[a-z_]+$`)
	for what, expr := range all {
		for _, name := range metricNames(t, what, expr) {
			if !osimagesMetric.MatchString(name) {
				t.Errorf("%s reads %q, not an osimages metric", what, name)
			}
		}
	}
	// Off by default.
	def, err := Render(chartDir, Release{Name: "osimages", Namespace: "sylva-system"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range def.Objects {
		if strings.HasPrefix(o.GetAPIVersion(), "monitoring.coreos.com/") || o.GetName() == "osimages-dashboard" {
			t.Errorf("%s %s rendered by default", o.GetKind(), o.GetName())
		}
	}
}

// exportedNames reads the metric families of a /metrics page.
func exportedNames(page string) map[string]bool {
	out := map[string]bool{}
	for _, line := range strings.Split(page, "\n") {
		if rest, ok := strings.CutPrefix(line, "# TYPE "); ok {
			out[strings.Fields(rest)[0]] = true
		}
	}
	return out
}

// checkExpressionsAgainst fails for every metric an alert or a panel reads
// that is not in exported.
func checkExpressionsAgainst(t *testing.T, exported map[string]bool) {
	t.Helper()
	r := renderMonitoring(t)
	all := alertRules(t, r)
	maps.Copy(all, dashboardExprs(t, r))
	for what, expr := range all {
		for _, name := range metricNames(t, what, expr) {
			if !exported[name] {
				t.Errorf("%s reads %s, which no running component exports", what, name)
			}
		}
	}
}
