package kube

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/sylva-projects/osimages/internal/clip"
	"github.com/sylva-projects/osimages/internal/testenv"
)

// suite is the apiserver of the package's tests; each test works in a
// namespace of its own.
var suite = testenv.NewSuite(nil)

func TestMain(m *testing.M) { os.Exit(suite.Run(m)) }

func TestParseObjectKey(t *testing.T) {
	if k, err := ParseObjectKey("ns/name"); err != nil || k != (ObjectKey{"ns", "name"}) || k.String() != "ns/name" {
		t.Errorf("ns/name: %v %v", k, err)
	}
	for _, bad := range []string{"", "name", "/name", "ns/", "ns/a/b"} {
		if _, err := ParseObjectKey(bad); err == nil || !strings.Contains(err.Error(), "want NAMESPACE/NAME") {
			t.Errorf("%q: want an error asking for NAMESPACE/NAME, got %v", bad, err)
		}
	}
}

func TestRESTConfig(t *testing.T) {
	k := suite.Kube(t)
	cfg, err := RESTConfig(k.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSuffix(cfg.Host, "/") != strings.TrimSuffix(k.Config.Host, "/") || cfg.UserAgent != "osimages" {
		t.Errorf("host %q user agent %q, want %q and osimages", cfg.Host, cfg.UserAgent, k.Config.Host)
	}
	c, err := Clientset(k.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	// Each group client of NewClient reaches its API group.
	ctx := context.Background()
	for name, list := range map[string]func() error{
		"configmaps": func() error { _, err := c.CoreV1().ConfigMaps("default").List(ctx, metav1.ListOptions{}); return err },
		"leases": func() error {
			_, err := c.CoordinationV1().Leases("default").List(ctx, metav1.ListOptions{})
			return err
		},
		"endpointslices": func() error {
			_, err := c.DiscoveryV1().EndpointSlices("default").List(ctx, metav1.ListOptions{})
			return err
		},
		"events": func() error { _, err := c.EventsV1().Events("default").List(ctx, metav1.ListOptions{}); return err },
	} {
		if err := list(); err != nil {
			t.Errorf("listing %s: the client does not reach the apiserver: %v", name, err)
		}
	}
	if _, err := RESTConfig(t.TempDir() + "/missing"); err == nil || !strings.Contains(err.Error(), "loading kubeconfig") {
		t.Errorf("a missing kubeconfig: %v", err)
	}
}

// ConfigMaps: a missing one reads as nil, its values name what is
// missing, and apply takes ownership of the fields osimages writes.
func TestConfigMaps(t *testing.T) {
	k := suite.Kube(t)
	ctx := context.Background()
	key := ObjectKey{Namespace: namespace(t, k, "kube-cm"), Name: "values"}
	if cm, err := GetConfigMap(ctx, k.Client, key); cm != nil || err != nil {
		t.Fatalf("missing ConfigMap: %v %v", cm, err)
	}
	if _, err := ConfigMapDocuments(ctx, k.Client, key, "values.yaml"); err == nil || err.Error() != "ConfigMap "+key.String()+" not found" {
		t.Errorf("missing ConfigMap values: %v", err)
	}
	// Another writer owns the data first: apply forces osimages in.
	other := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: key.Name, Namespace: key.Namespace}, Data: map[string]string{"other": "x"}}
	if _, err := k.Client.CoreV1().ConfigMaps(key.Namespace).Create(ctx, other, metav1.CreateOptions{FieldManager: "someone-else"}); err != nil {
		t.Fatal(err)
	}
	if _, err := ConfigMapDocuments(ctx, k.Client, key, "values.yaml"); err == nil || err.Error() != "ConfigMap "+key.String()+` has no data key "values.yaml"` {
		t.Errorf("missing data key: %v", err)
	}
	out, err := ApplyConfigMap(ctx, k.Client, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: key.Name, Namespace: key.Namespace, Labels: map[string]string{"l": "v"}},
		Data: map[string]string{"values.yaml": "a: 1\n", "other": "y"}})
	if err != nil {
		t.Fatal(err)
	}
	if out.Labels["l"] != "v" || out.Data["other"] != "y" {
		t.Errorf("applied: %v %v", out.Labels, out.Data)
	}
	owner := map[string]bool{}
	for _, mf := range out.ManagedFields {
		if strings.Contains(string(mf.FieldsV1.Raw), `"f:other"`) {
			owner[mf.Manager] = true
		}
	}
	if !owner[FieldManager] || owner["someone-else"] {
		t.Errorf("data.other owned by %v, want %s alone", owner, FieldManager)
	}
	if v, err := ConfigMapDocuments(ctx, k.Client, key, "values.yaml"); err != nil || string(v["values.yaml"]) != "a: 1\n" {
		t.Errorf("values: %q %v", v, err)
	}
}

// ApplyObjects is all or nothing as far as the apiserver tells in
// advance: one object refused leaves every other one unwritten.
func TestApplyObjectsAllOrNothing(t *testing.T) {
	k := suite.Kube(t)
	ctx := context.Background()
	ns := namespace(t, k, "kube-apply")
	cm := func(name string, data any) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "ConfigMap",
			"metadata": map[string]any{"name": name, "namespace": ns}, "data": data}}
	}
	// data must be strings: the schema refuses the second object.
	err := ApplyObjects(ctx, k.Config, []*unstructured.Unstructured{cm("first", map[string]any{"a": "1"}), cm("second", map[string]any{"a": int64(1)})})
	if err == nil || !strings.Contains(err.Error(), "applying ConfigMap "+ns+"/second") {
		t.Fatalf("want the second object refused, got %v", err)
	}
	if _, err := k.Client.CoreV1().ConfigMaps(ns).Get(ctx, "first", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the first object was written although the second was refused: %v", err)
	}
	if err := ApplyObjects(ctx, k.Config, []*unstructured.Unstructured{cm("first", map[string]any{"a": "1"}), cm("second", map[string]any{"a": "2"})}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"first", "second"} {
		if _, err := k.Client.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{}); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	// A kind the apiserver does not serve names the object and the cause.
	missing := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "example.org/v1", "kind": "Nothing", "metadata": map[string]any{"name": "n", "namespace": ns}}}
	if err := ApplyObjects(ctx, k.Config, []*unstructured.Unstructured{missing}); err == nil || !strings.Contains(err.Error(), "Nothing n") || !strings.Contains(err.Error(), "is its CRD installed?") {
		t.Errorf("unknown kind: %v", err)
	}
}

// The managers' log clips each value: an error quoting a tenant's value
// of a megabyte is a line of a few KiB that says it was clipped.
func TestNewLoggerClipsValues(t *testing.T) {
	big := strings.Repeat("v", 1<<20)
	for _, format := range []string{"json", "text"} {
		var out strings.Builder
		log, err := NewLogger(&out, format, 0)
		if err != nil {
			t.Fatal(err)
		}
		log.Error(errors.New("values refused: "+big), "catalog not published", "namespace", "tenant", "input", big, "inputs", []string{big})
		line := out.String()
		if len(line) > 4*clip.LogValue || !strings.Contains(line, "values refused: vvv") || strings.Count(line, "[clipped: ") != 3 || !strings.Contains(line, "tenant") {
			t.Errorf("%s: a line of %d bytes: %.400s", format, len(line), line)
		}
	}
}
