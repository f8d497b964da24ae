package propagate

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/sylva-projects/osimages/internal/kube"
	"github.com/sylva-projects/osimages/internal/testenv"
)

const settle = 30 * time.Second

// TestSemantics walks the table, row by row, against one running
// controller.
func TestSemantics(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.writeSource("v1")
	semA, semB, semPlain, semNew := e.ns("sem-a"), e.ns("sem-b"), e.ns("sem-plain"), e.ns("sem-new")
	before := []string{semA, semB}
	for _, ns := range before {
		e.createNamespace(ns, true)
	}
	e.createNamespace(semPlain, false)
	ctl := e.start(Options{})
	labelled := append([]string{}, before...)

	t.Run("namespaces labelled before the controller started: copies created at start", func(t *testing.T) {
		e.waitCopies(labelled, "v1", settle)
		cp := e.getCopy(semA)
		if cp.Labels[LabelSourceNamespace] != e.rule.Source.Namespace || cp.Labels[LabelSourceName] != "served" ||
			cp.Annotations[AnnotationSourceHash] != SourceHash(e.source()) {
			t.Errorf("copy marks: labels %v annotations %v", cp.Labels, cp.Annotations)
		}
		if e.getCopy(semPlain) != nil {
			t.Error("copy in a namespace without the label")
		}
	})

	t.Run("source changes: every copy gets the new data", func(t *testing.T) {
		e.writeSource("v2")
		e.waitCopies(labelled, "v2", settle)
	})

	t.Run("copy edited: put back", func(t *testing.T) {
		cp := e.getCopy(semA)
		cp.Data["values.yaml"] = "edited by hand"
		cp.Labels["someone"] = "else"
		if err := e.c.Update(ctx, cp); err != nil {
			t.Fatal(err)
		}
		e.waitCopies(labelled, "v2", settle)
		if e.getCopy(semA).Labels["someone"] != "else" {
			t.Error("a label added by someone else was removed")
		}
	})

	t.Run("copy deleted: recreated", func(t *testing.T) {
		cp := e.getCopy(semB)
		if err := e.c.Delete(ctx, cp); err != nil {
			t.Fatal(err)
		}
		eventually(t, settle, func() error {
			if again := e.getCopy(semB); again == nil || again.UID == cp.UID {
				return fmt.Errorf("not recreated yet")
			}
			return nil
		})
		e.waitCopies(labelled, "v2", settle)
	})

	t.Run("namespace gains the label: copy created", func(t *testing.T) {
		e.setLabel(semPlain, true)
		labelled = append(labelled, semPlain)
		e.waitCopies(labelled, "v2", settle)
	})

	t.Run("namespace created with the label: copy created", func(t *testing.T) {
		e.createNamespace(semNew, true)
		labelled = append(labelled, semNew)
		e.waitCopies(labelled, "v2", settle)
	})

	t.Run("namespace loses the label: copy deleted", func(t *testing.T) {
		e.setLabel(semPlain, false)
		labelled = labelled[:len(labelled)-2]
		labelled = append(labelled, semNew)
		e.waitCopies(labelled, "v2", settle)
		if e.getCopy(semPlain) != nil {
			t.Error("copy still there")
		}
	})

	t.Run("source deleted: copies kept and marked stale, with an event and a metric", func(t *testing.T) {
		if err := e.c.Delete(ctx, e.source()); err != nil {
			t.Fatal(err)
		}
		eventually(t, settle, func() error {
			for _, ns := range labelled {
				cp := e.getCopy(ns)
				if cp == nil {
					return fmt.Errorf("copy in %s deleted", ns)
				}
				if cp.Annotations[AnnotationStaleSince] == "" {
					return fmt.Errorf("copy in %s not marked stale yet", ns)
				}
				if cp.Data["values.yaml"] != "v2" {
					return fmt.Errorf("copy in %s lost its data: %v", ns, cp.Data)
				}
			}
			return nil
		})
		eventually(t, settle, func() error {
			if n := len(e.events(semA, "ConfigMap", e.rule.Target)["SourceMissing"]); n == 0 {
				return fmt.Errorf("no SourceMissing event")
			}
			if got := ctl.copies(t, e.rule.Name, StateStale); got != float64(len(labelled)) {
				return fmt.Errorf("stale copies metric %v, want %d", got, len(labelled))
			}
			if got := ctl.metric(t, "osimages_propagate_source_present", map[string]string{"rule": e.rule.Name}); got != 0 {
				return fmt.Errorf("source_present %v", got)
			}
			return nil
		})
	})

	t.Run("source comes back: copies follow it again", func(t *testing.T) {
		e.writeSource("v3")
		e.waitCopies(labelled, "v3", settle)
		for _, ns := range labelled {
			if cp := e.getCopy(ns); cp.Annotations[AnnotationStaleSince] != "" {
				t.Errorf("copy in %s still marked stale", ns)
			}
		}
		eventually(t, settle, func() error {
			if got := ctl.copies(t, e.rule.Name, StateInSync); got != float64(len(labelled)) {
				return fmt.Errorf("in_sync metric %v, want %d", got, len(labelled))
			}
			if got := ctl.copies(t, e.rule.Name, StateStale); got != 0 {
				return fmt.Errorf("stale metric %v", got)
			}
			return nil
		})
	})

	t.Run("the source is never modified", func(t *testing.T) {
		src := e.source()
		if len(src.Labels) != 1 || src.Labels["app.kubernetes.io/managed-by"] != "Helm" || len(src.Annotations) != 0 {
			t.Errorf("source metadata changed: labels %v annotations %v", src.Labels, src.Annotations)
		}
		for _, mf := range src.ManagedFields {
			if mf.Manager == FieldOwner {
				t.Errorf("osimages wrote to the source: %+v", mf)
			}
		}
	})

	t.Run("rule removed from the config: copies left in place", func(t *testing.T) {
		ctl.stop()
		// The same cluster, a config without the rule: another rule, to
		// know when the controller has done its work.
		other := Rule{Name: e.rule.Name + "-other", Source: e.rule.Source, Target: "other-copy", Selector: e.rule.Selector}
		next := e.start(Options{Rules: []Rule{other}})
		e.setLabel(semA, false)
		e.writeSource("v4")
		eventually(t, settle, func() error {
			if got := next.copies(t, other.Name, StateInSync); got != float64(len(labelled)-1) {
				return fmt.Errorf("other rule: %v copies in sync", got)
			}
			return nil
		})
		got := e.copiesByNamespace()
		if len(got) != len(labelled) {
			t.Fatalf("%d copies left, want %d", len(got), len(labelled))
		}
		for ns, cp := range got {
			if cp.Data["values.yaml"] != "v3" {
				t.Errorf("copy in %s changed to %v", ns, cp.Data)
			}
		}
	})
}

// TestUnmanagedObjectInTheWay: an object of the target name that osimages
// did not create is left as it is (event, metric), unless adopting.
func TestUnmanagedObjectInTheWay(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.writeSource("v1")
	taken, free := e.ns("way-taken"), e.ns("way-free")
	e.createNamespace(taken, true)
	e.createNamespace(free, true)
	theirs := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: taken, Name: e.rule.Target, Labels: map[string]string{"generate.kyverno.io/clone-source": ""}},
		Data:       map[string]string{"values.yaml": "kyverno's"},
	}
	if err := e.c.Create(ctx, theirs); err != nil {
		t.Fatal(err)
	}
	ctl := e.start(Options{})
	e.waitCopies([]string{free}, "v1", settle)
	eventually(t, settle, func() error {
		if len(e.events(taken, "ConfigMap", e.rule.Target)["TargetNameTaken"]) == 0 {
			return fmt.Errorf("no TargetNameTaken event")
		}
		if got := ctl.copies(t, e.rule.Name, StateConflict); got != 1 {
			return fmt.Errorf("conflict metric %v", got)
		}
		return nil
	})
	e.writeSource("v2")
	e.waitCopies([]string{free}, "v2", settle)
	if got := e.getCopy(taken); got.ResourceVersion != theirs.ResourceVersion || got.Data["values.yaml"] != "kyverno's" {
		t.Fatalf("the object in the way was written: %v", got)
	}

	ctl.stop()
	adopting := e.start(Options{Adopt: true})
	e.waitCopies([]string{free, taken}, "v2", settle)
	got := e.getCopy(taken)
	if got.UID != theirs.UID || got.Labels["generate.kyverno.io/clone-source"] != "" || got.Labels[LabelRule] != e.rule.Name {
		t.Errorf("adoption should keep the object and its labels: %+v", got.ObjectMeta)
	}
	eventually(t, settle, func() error {
		if got := adopting.copies(t, e.rule.Name, StateConflict); got != 0 {
			return fmt.Errorf("conflict metric %v after adoption", got)
		}
		return nil
	})
}

// TestRestartRebuildsState: a new controller knows its copies from their
// labels alone. Restarted on a cluster in sync, it writes nothing; restarted
// after changes made while it was down, it catches up, with one copy per
// namespace.
func TestRestartRebuildsState(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.writeSource("v1")
	names := e.createNamespaces("restart", 20)
	first := e.start(Options{})
	e.waitCopies(names, "v1", settle)
	uids := map[string]string{}
	for ns, cp := range e.copiesByNamespace() {
		uids[ns] = string(cp.UID)
	}
	first.stop()

	second := e.start(Options{})
	eventually(t, settle, func() error {
		if got := second.copies(t, e.rule.Name, StateInSync); got != 20 {
			return fmt.Errorf("in_sync %v", got)
		}
		if got := second.metric(t, "osimages_propagate_seconds_since_last_sync", map[string]string{"rule": e.rule.Name}); got < 0 {
			return fmt.Errorf("no reconcile yet")
		}
		return nil
	})
	if w := second.writes(t, e.rule.Name); w != 0 {
		t.Errorf("restart on a cluster in sync wrote %v times", w)
	}
	second.stop()

	// Changes while no controller runs.
	e.writeSource("v2")
	if err := e.c.Delete(ctx, e.getCopy(names[0])); err != nil {
		t.Fatal(err)
	}
	e.setLabel(names[1], false)
	late := e.ns("restart-late")
	e.createNamespace(late, true)
	want := append(append([]string{}, names[0]), names[2:]...)
	want = append(want, late)

	e.start(Options{})
	e.waitCopies(want, "v2", settle)
	for ns, cp := range e.copiesByNamespace() {
		if old, ok := uids[ns]; ok && ns != names[0] && string(cp.UID) != old {
			t.Errorf("copy in %s was recreated instead of updated", ns)
		}
	}
}

// TestLeaderElection: of two replicas, only the leader writes; when it
// stops, the other takes over.
func TestLeaderElection(t *testing.T) {
	e := newEnv(t)
	e.writeSource("v1")
	names := e.createNamespaces("leader", 5)
	o := Options{
		ManagerOptions: kube.ManagerOptions{
			LeaderElection:          true,
			LeaderElectionNamespace: e.rule.Source.Namespace,
			LeaderElectionID:        "propagate-" + e.rule.Name,
			LeaseDuration:           4 * time.Second, RenewDeadline: 3 * time.Second, RetryPeriod: 500 * time.Millisecond,
		},
	}
	a, b := e.start(o), e.start(o)
	e.waitCopies(names, "v1", settle)

	leader, follower := a, b
	select {
	case <-a.mgr.Elected():
	case <-b.mgr.Elected():
		leader, follower = b, a
	}
	select {
	case <-follower.mgr.Elected():
		t.Fatal("both replicas lead")
	default:
	}
	e.writeSource("v2")
	e.waitCopies(names, "v2", settle)
	// A write is counted once its answer is back, a moment after the
	// copy can be seen: wait for the count, then hold it to its value.
	waitWrites(t, leader, e.rule.Name, 10)
	if w := leader.writes(t, e.rule.Name); w != 10 {
		t.Errorf("leader wrote %v times, want 10 (5 creates, 5 updates)", w)
	}
	if w := follower.writes(t, e.rule.Name); w != 0 {
		t.Errorf("follower wrote %v times", w)
	}
	// Both report what the cluster holds.
	eventually(t, settle, func() error {
		if got := follower.copies(t, e.rule.Name, StateInSync); got != 5 {
			return fmt.Errorf("follower in_sync %v", got)
		}
		return nil
	})

	leader.stop()
	select {
	case <-follower.mgr.Elected():
	case <-time.After(settle):
		t.Fatal("the follower did not take over")
	}
	e.writeSource("v3")
	e.waitCopies(names, "v3", settle)
	waitWrites(t, follower, e.rule.Name, 5)
	if w := follower.writes(t, e.rule.Name); w != 5 {
		t.Errorf("new leader wrote %v times, want 5", w)
	}
}

// waitWrites waits until r has counted at least n writes for rule.
func waitWrites(t *testing.T, r *replica, rule string, n float64) {
	t.Helper()
	eventually(t, settle, func() error {
		if w := r.writes(t, rule); w < n {
			return fmt.Errorf("%s wrote %v times so far, want %v", rule, w, n)
		}
		return nil
	})
}

// TestResync: with nothing happening, every copy is still checked at the
// resync period, which the last-sync metric shows. The test watches the
// informer's replays (updates that bring the same resourceVersion, which
// no write makes), then waits for a check later than one of them: it
// does not depend on how fast a loaded machine runs.
func TestResync(t *testing.T) {
	e := newEnv(t)
	e.writeSource("v1")
	names := e.createNamespaces("resync", 2)
	ctl := e.start(Options{Resync: time.Second})
	e.waitCopies(names, "v1", settle)

	inf, err := ctl.mgr.GetCache().GetInformer(context.Background(), &corev1.ConfigMap{})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	replays := map[string][]time.Time{} // by namespace
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{UpdateFunc: func(oldObj, newObj any) {
		old, ok1 := oldObj.(*corev1.ConfigMap)
		cm, ok2 := newObj.(*corev1.ConfigMap)
		if !ok1 || !ok2 || cm.Name != e.rule.Target || !slices.Contains(names, cm.Namespace) || old.ResourceVersion != cm.ResourceVersion {
			return
		}
		mu.Lock()
		replays[cm.Namespace] = append(replays[cm.Namespace], time.Now())
		mu.Unlock()
	}}); err != nil {
		t.Fatal(err)
	}
	// The second round of replays: whatever the copies' own writes set
	// off was delivered before the first.
	var replayed time.Time
	testenv.Eventually(t, "every copy replayed twice", settle, func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		replayed = time.Time{}
		for _, ns := range names {
			if len(replays[ns]) < 2 {
				return false, fmt.Sprint(replays)
			}
			if replayed.IsZero() || replays[ns][1].Before(replayed) {
				replayed = replays[ns][1]
			}
		}
		return true, ""
	})
	testenv.Eventually(t, "a check after a replay in osimages_propagate_seconds_since_last_sync", settle, func() (bool, string) {
		// Measured before the metric: a last sync younger than this is
		// later than the replay.
		elapsed := time.Since(replayed).Seconds()
		since := ctl.metric(t, "osimages_propagate_seconds_since_last_sync", map[string]string{"rule": e.rule.Name})
		return since >= 0 && since < elapsed, fmt.Sprintf("last sync %.2fs ago, the replay %.2fs ago", since, elapsed)
	})
}

// TestSeveralRules: rules run side by side, each with its own source,
// target and selector.
func TestSeveralRules(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.writeSource("images")
	state := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: e.rule.Source.Namespace, Name: "mgmt-cluster-state-values"},
		Data:       map[string]string{"values": "state"},
	}
	if err := e.c.Create(ctx, state); err != nil {
		t.Fatal(err)
	}
	second := Rule{
		Name:     e.rule.Name + "-state",
		Source:   kube.ObjectKey{Namespace: e.rule.Source.Namespace, Name: state.Name},
		Target:   "state-copy",
		Selector: labels.SelectorFromSet(labels.Set{e.label: ""}),
	}
	names := e.createNamespaces("rules", 3)
	e.start(Options{Rules: []Rule{e.rule, second}})
	e.waitCopies(names, "images", settle)
	eventually(t, settle, func() error {
		var list corev1.ConfigMapList
		if err := e.c.List(ctx, &list, client.MatchingLabels{LabelRule: second.Name}); err != nil {
			return err
		}
		if len(list.Items) != 3 {
			return fmt.Errorf("%d copies of the second rule", len(list.Items))
		}
		for _, cp := range list.Items {
			if cp.Name != "state-copy" || cp.Data["values"] != "state" {
				return fmt.Errorf("copy %s/%s: %v", cp.Namespace, cp.Name, cp.Data)
			}
		}
		return nil
	})
}
