package propagate

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/sylva-projects/osimages/internal/kube"
	"github.com/sylva-projects/osimages/internal/testenv"
)

type env struct {
	t    *testing.T
	kube *testenv.Kube
	c    client.Client // direct to the apiserver, no cache
	// label selects the test's namespaces; rule is the test's rule.
	label string
	rule  Rule
	// run tells this run of the test from the others of the process
	// (go test -count=N): the apiserver outlives a test and never
	// finishes deleting a namespace, so each run needs names of its own.
	run string
}

// runs numbers the envs of the process, for env.run.
var runs atomic.Int64

func newEnv(t *testing.T) *env {
	t.Helper()
	k := suite.Kube(t)
	c, err := client.New(k.Config, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	id := strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name()))
	if len(id) > 40 {
		id = id[:40]
	}
	run := fmt.Sprintf("r%d", runs.Add(1))
	id = strings.Trim(id, "-") + "-" + run
	e := &env{t: t, kube: k, c: c, label: "test.osimages/" + id, run: run}
	e.rule = Rule{
		Name:     id,
		Source:   kube.ObjectKey{Namespace: id + "-src", Name: "served"},
		Target:   "served-copy",
		Selector: labels.SelectorFromSet(labels.Set{e.label: ""}),
	}
	e.createNamespace(e.rule.Source.Namespace, false)
	return e
}

// replica is one controller manager, run inside the test process.
type replica struct {
	mgr manager.Manager
	reg *prometheus.Registry
	// stop stops the replica (it stops with the test otherwise).
	stop func()
}

func (e *env) start(o Options) *replica {
	e.t.Helper()
	if o.Rules == nil {
		o.Rules = []Rule{e.rule}
	}
	reg := prometheus.NewRegistry()
	o.Registerer = reg
	o.MetricsAddr = "0"
	if o.Logger.GetSink() == nil {
		o.Logger = testLogger()
	}
	mgr, err := NewManager(e.kube.Config, o)
	if err != nil {
		e.t.Fatal(err)
	}
	return &replica{mgr: mgr, reg: reg, stop: testenv.StartManager(e.t, mgr)}
}

// metric returns the value of the sample of family name with exactly the
// given label values, or -1 when there is none.
func (c *replica) metric(t *testing.T, name string, lbls map[string]string) float64 {
	t.Helper()
	mfs, err := c.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	samples:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if v, ok := lbls[lp.GetName()]; ok && v != lp.GetValue() {
					continue samples
				}
			}
			switch {
			case m.Gauge != nil:
				return m.Gauge.GetValue()
			case m.Counter != nil:
				return m.Counter.GetValue()
			}
		}
	}
	return -1
}

func (c *replica) writes(t *testing.T, rule string) float64 {
	var sum float64
	for _, a := range []Action{ActionCreate, ActionUpdate, ActionDelete, ActionMarkStale} {
		sum += c.metric(t, "osimages_propagate_writes_total", map[string]string{"rule": rule, "action": string(a)})
	}
	return sum
}

func (c *replica) copies(t *testing.T, rule string, s State) float64 {
	return c.metric(t, "osimages_propagate_copies", map[string]string{"rule": rule, "state": string(s)})
}

// testLogger shows the controller's logs with -v. They go to stderr, not
// t.Log, because the manager may still log while a test ends.
func testLogger() logr.Logger {
	if testing.Verbose() {
		return logr.FromSlogHandler(slog.NewTextHandler(os.Stderr, nil))
	}
	return logr.Discard()
}

// ns returns the name of the test's namespace called name in this run.
func (e *env) ns(name string) string { return name + "-" + e.run }

// createNamespace creates the namespace name, as given: the test names it
// with ns.
func (e *env) createNamespace(name string, labelled bool) {
	e.t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if labelled {
		ns.Labels = map[string]string{e.label: ""}
	}
	if err := e.c.Create(context.Background(), ns); err != nil {
		e.t.Fatal(err)
	}
}

// createNamespaces creates n labelled namespaces, the run's names of
// PREFIX-0..n-1, several at once.
func (e *env) createNamespaces(prefix string, n int) []string {
	e.t.Helper()
	names := make([]string, n)
	errs := make(chan error, n)
	sem := make(chan struct{}, 16)
	var wg sync.WaitGroup
	for i := range names {
		names[i] = e.ns(fmt.Sprintf("%s-%d", prefix, i))
		wg.Add(1)
		go func(name string) {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{e.label: ""}}}
			if err := e.c.Create(context.Background(), ns); err != nil {
				errs <- err
			}
		}(names[i])
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		e.t.Fatal(err)
	}
	return names
}

func (e *env) setLabel(ns string, labelled bool) {
	e.t.Helper()
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:null}}}`, e.label)
	if labelled {
		patch = fmt.Sprintf(`{"metadata":{"labels":{%q:""}}}`, e.label)
	}
	obj := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}
	if err := e.c.Patch(context.Background(), obj, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
		e.t.Fatal(err)
	}
}

// writeSource creates or updates the source with one values.yaml.
func (e *env) writeSource(values string) *corev1.ConfigMap {
	e.t.Helper()
	ctx := context.Background()
	src := &corev1.ConfigMap{}
	err := e.c.Get(ctx, types.NamespacedName{Namespace: e.rule.Source.Namespace, Name: e.rule.Source.Name}, src)
	switch {
	case apierrors.IsNotFound(err):
		src = &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Namespace: e.rule.Source.Namespace, Name: e.rule.Source.Name,
				Labels: map[string]string{"app.kubernetes.io/managed-by": "Helm"}},
			Data: map[string]string{"values.yaml": values},
		}
		err = e.c.Create(ctx, src)
	case err == nil:
		src.Data = map[string]string{"values.yaml": values}
		err = e.c.Update(ctx, src)
	}
	if err != nil {
		e.t.Fatal(err)
	}
	return src
}

func (e *env) source() *corev1.ConfigMap {
	e.t.Helper()
	src := &corev1.ConfigMap{}
	if err := e.c.Get(context.Background(), types.NamespacedName{Namespace: e.rule.Source.Namespace, Name: e.rule.Source.Name}, src); err != nil {
		e.t.Fatal(err)
	}
	return src
}

// getCopy returns the object of the target name in ns, or nil.
func (e *env) getCopy(ns string) *corev1.ConfigMap {
	e.t.Helper()
	cm := &corev1.ConfigMap{}
	err := e.c.Get(context.Background(), types.NamespacedName{Namespace: ns, Name: e.rule.Target}, cm)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		e.t.Fatal(err)
	}
	return cm
}

// copiesByNamespace lists, in one call, every object of the target name
// that the rule's label marks.
func (e *env) copiesByNamespace() map[string]*corev1.ConfigMap {
	e.t.Helper()
	var list corev1.ConfigMapList
	if err := e.c.List(context.Background(), &list, client.MatchingLabels{LabelRule: e.rule.Name}); err != nil {
		e.t.Fatal(err)
	}
	out := map[string]*corev1.ConfigMap{}
	for i := range list.Items {
		cm := &list.Items[i]
		if _, dup := out[cm.Namespace]; dup {
			e.t.Fatalf("two copies in %s", cm.Namespace)
		}
		out[cm.Namespace] = cm
	}
	return out
}

// waitCopies waits until exactly the namespaces given hold a copy with
// values.yaml = values.
func (e *env) waitCopies(namespaces []string, values string, timeout time.Duration) {
	e.t.Helper()
	want := map[string]bool{}
	for _, ns := range namespaces {
		want[ns] = true
	}
	eventually(e.t, timeout, func() error {
		got := e.copiesByNamespace()
		for ns := range want {
			cp, ok := got[ns]
			if !ok {
				return fmt.Errorf("no copy in %s (%d of %d copies)", ns, len(got), len(want))
			}
			if cp.Data["values.yaml"] != values {
				return fmt.Errorf("copy in %s has %q, want %q", ns, cp.Data["values.yaml"], values)
			}
		}
		for ns := range got {
			if !want[ns] {
				return fmt.Errorf("unexpected copy in %s", ns)
			}
		}
		return nil
	})
}

// eventually polls f until it returns nil; every 100 ms, since f often
// lists every copy.
func eventually(t *testing.T, timeout time.Duration, f func() error) {
	t.Helper()
	testenv.Poll(t, "waiting for the copies", timeout, 100*time.Millisecond, func() (bool, string) {
		err := f()
		return err == nil, fmt.Sprint(err)
	})
}

// events returns the events.k8s.io events about the object in ns, by
// reason.
func (e *env) events(ns, kind, name string) map[string][]eventsv1.Event {
	e.t.Helper()
	var list eventsv1.EventList
	if err := e.c.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
		e.t.Fatal(err)
	}
	out := map[string][]eventsv1.Event{}
	for _, ev := range list.Items {
		if ev.Regarding.Kind == kind && ev.Regarding.Name == name {
			out[ev.Reason] = append(out[ev.Reason], ev)
		}
	}
	return out
}
