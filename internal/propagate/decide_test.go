package propagate

import (
	"maps"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/ptr"

	"github.com/sylva-projects/osimages/internal/kube"
)

var (
	now  = time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	rule = Rule{
		Name:     "images",
		Source:   kube.ObjectKey{Namespace: "sylva-system", Name: "served"},
		Target:   "served-copy",
		Selector: labels.SelectorFromSet(labels.Set{"wc": ""}),
	}
)

func namespace(name string, lbls map[string]string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: lbls, UID: "ns-uid"}}
}

func source(data string) *corev1.ConfigMap {
	return &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: "sylva-system", Name: "served", Labels: map[string]string{"helm": "x"}, UID: "source-uid"},
		Data:       map[string]string{"values.yaml": data},
	}
}

// ourCopy is what osimages writes for source(data) in ns, as stored.
func ourCopy(ns, data string) *corev1.ConfigMap {
	src := source(data)
	want, err := wanted(rule, Observed{Source: src})
	if err != nil {
		panic(err)
	}
	cp := newCopy(rule, src, ns, want)
	cp.ResourceVersion = "42"
	cp.UID = "copy-uid"
	return cp
}

func edit(cm *corev1.ConfigMap, f func(*corev1.ConfigMap)) *corev1.ConfigMap {
	f(cm)
	return cm
}

func TestDecide(t *testing.T) {
	wc := namespace("wc1", map[string]string{"wc": ""})
	plain := namespace("other", map[string]string{"team": "a"})
	unmanaged := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: "wc1", Name: "served-copy", ResourceVersion: "7", Labels: map[string]string{"owner": "someone"}},
		Data:       map[string]string{"values.yaml": "theirs"},
	}
	staleCopy := edit(ourCopy("wc1", "v1"), func(cm *corev1.ConfigMap) {
		cm.Annotations[AnnotationStaleSince] = "2026-12-01T00:00:00Z"
	})

	tests := []struct {
		name   string
		rule   Rule
		obs    Observed
		adopt  bool
		action Action
		state  State
		// check looks at the object to write, when there is one.
		check func(t *testing.T, obj *corev1.ConfigMap)
	}{
		{name: "namespace gone", obs: Observed{Source: source("v1")}, action: ActionNone, state: StateAbsent},
		{name: "namespace terminating",
			obs:    Observed{Namespace: edit2(wc, func(ns *corev1.Namespace) { ns.Status.Phase = corev1.NamespaceTerminating }), Source: source("v1")},
			action: ActionNone, state: StateAbsent},
		{name: "namespace being deleted",
			obs:    Observed{Namespace: edit2(wc, func(ns *corev1.Namespace) { ns.DeletionTimestamp = &metav1.Time{Time: now} }), Source: source("v1")},
			action: ActionNone, state: StateAbsent},
		{name: "labelled namespace, no copy: created",
			obs:    Observed{Namespace: wc, Source: source("v1")},
			action: ActionCreate, state: StateOutOfSync,
			check: func(t *testing.T, obj *corev1.ConfigMap) {
				if obj.Namespace != "wc1" || obj.Name != "served-copy" || obj.Data["values.yaml"] != "v1" {
					t.Errorf("copy %s/%s data %v", obj.Namespace, obj.Name, obj.Data)
				}
				want := map[string]string{LabelRule: "images", LabelSourceNamespace: "sylva-system", LabelSourceName: "served"}
				if !maps.Equal(obj.Labels, want) {
					t.Errorf("labels %v, want %v (the source's own labels are not copied)", obj.Labels, want)
				}
				if obj.Annotations[AnnotationSourceHash] != SourceHash(source("v1")) {
					t.Errorf("hash annotation %q", obj.Annotations[AnnotationSourceHash])
				}
			}},
		{name: "copy in sync: nothing", obs: Observed{Namespace: wc, Source: source("v1"), Copy: ourCopy("wc1", "v1")}, action: ActionNone, state: StateInSync},
		{name: "source changed: copy updated, conditionally",
			obs:    Observed{Namespace: wc, Source: source("v2"), Copy: ourCopy("wc1", "v1")},
			action: ActionUpdate, state: StateOutOfSync,
			check: func(t *testing.T, obj *corev1.ConfigMap) {
				if obj.Data["values.yaml"] != "v2" || obj.ResourceVersion != "42" || obj.UID != "copy-uid" {
					t.Errorf("update: data %v rv %q uid %q", obj.Data, obj.ResourceVersion, obj.UID)
				}
				if obj.Annotations[AnnotationSourceHash] != SourceHash(source("v2")) {
					t.Errorf("hash annotation not moved to v2: %q", obj.Annotations[AnnotationSourceHash])
				}
			}},
		{name: "copy data edited: put back, others' metadata kept",
			obs: Observed{Namespace: wc, Source: source("v1"), Copy: edit(ourCopy("wc1", "v1"), func(cm *corev1.ConfigMap) {
				cm.Data["values.yaml"] = "hand edit"
				cm.Data["extra"] = "x"
				cm.Labels["argocd"] = "tracked"
				cm.Annotations["note"] = "kept"
			})},
			action: ActionUpdate, state: StateOutOfSync,
			check: func(t *testing.T, obj *corev1.ConfigMap) {
				if !maps.Equal(obj.Data, map[string]string{"values.yaml": "v1"}) {
					t.Errorf("data %v", obj.Data)
				}
				if obj.Labels["argocd"] != "tracked" || obj.Annotations["note"] != "kept" {
					t.Errorf("metadata added by others lost: %v %v", obj.Labels, obj.Annotations)
				}
			}},
		{name: "copy binaryData added: removed",
			obs: Observed{Namespace: wc, Source: source("v1"), Copy: edit(ourCopy("wc1", "v1"), func(cm *corev1.ConfigMap) {
				cm.BinaryData = map[string][]byte{"x": {1}}
			})},
			action: ActionUpdate, state: StateOutOfSync,
			check: func(t *testing.T, obj *corev1.ConfigMap) {
				if len(obj.BinaryData) != 0 {
					t.Errorf("binaryData %v", obj.BinaryData)
				}
			}},
		{name: "copy source label edited: put back",
			obs: Observed{Namespace: wc, Source: source("v1"), Copy: edit(ourCopy("wc1", "v1"), func(cm *corev1.ConfigMap) {
				cm.Labels[LabelSourceName] = "elsewhere"
			})},
			action: ActionUpdate, state: StateOutOfSync,
			check: func(t *testing.T, obj *corev1.ConfigMap) {
				if obj.Labels[LabelSourceName] != "served" {
					t.Errorf("labels %v", obj.Labels)
				}
			}},
		{name: "copy hash annotation edited: put back",
			obs: Observed{Namespace: wc, Source: source("v1"), Copy: edit(ourCopy("wc1", "v1"), func(cm *corev1.ConfigMap) {
				cm.Annotations[AnnotationSourceHash] = "sha256:0"
			})},
			action: ActionUpdate, state: StateOutOfSync},
		{name: "namespace lost the label: copy deleted",
			obs:    Observed{Namespace: namespace("wc1", nil), Source: source("v1"), Copy: ourCopy("wc1", "v1")},
			action: ActionDelete, state: StateOutOfSync,
			check: func(t *testing.T, obj *corev1.ConfigMap) {
				if obj.UID != "copy-uid" || obj.ResourceVersion != "42" {
					t.Errorf("delete must carry the preconditions: uid %q rv %q", obj.UID, obj.ResourceVersion)
				}
			}},
		{name: "namespace not matching, no copy: nothing", obs: Observed{Namespace: plain, Source: source("v1")}, action: ActionNone, state: StateAbsent},
		{name: "namespace not matching, someone's object: left alone",
			obs:    Observed{Namespace: plain, Source: source("v1"), Copy: edit(unmanaged.DeepCopy(), func(cm *corev1.ConfigMap) { cm.Namespace = "other" })},
			action: ActionNone, state: StateAbsent},
		{name: "namespace not matching, copy of a rule removed from the config: left in place",
			obs: Observed{Namespace: plain, Source: source("v1"), Copy: edit(ourCopy("other", "v1"), func(cm *corev1.ConfigMap) {
				cm.Labels[LabelRule] = "removed-rule"
			})},
			action: ActionNone, state: StateAbsent},
		{name: "matching namespace, copy of a rule removed from the config: taken over",
			obs: Observed{Namespace: wc, Source: source("v1"), Copy: edit(ourCopy("wc1", "v1"), func(cm *corev1.ConfigMap) {
				cm.Labels[LabelRule] = "old-name"
			})},
			action: ActionUpdate, state: StateOutOfSync,
			check: func(t *testing.T, obj *corev1.ConfigMap) {
				if obj.Labels[LabelRule] != "images" {
					t.Errorf("rule label %q", obj.Labels[LabelRule])
				}
			}},
		{name: "object not created by osimages: never overwritten",
			obs:    Observed{Namespace: wc, Source: source("v1"), Copy: unmanaged},
			action: ActionNone, state: StateConflict},
		{name: "object whose ownership label was removed: not ours any more",
			obs: Observed{Namespace: wc, Source: source("v1"), Copy: edit(ourCopy("wc1", "v0"), func(cm *corev1.ConfigMap) {
				delete(cm.Labels, LabelRule)
			})},
			action: ActionNone, state: StateConflict},
		{name: "object not created by osimages, --adopt: taken over",
			obs: Observed{Namespace: wc, Source: source("v1"), Copy: unmanaged}, adopt: true,
			action: ActionUpdate, state: StateOutOfSync,
			check: func(t *testing.T, obj *corev1.ConfigMap) {
				if obj.Labels[LabelRule] != "images" || obj.Labels["owner"] != "someone" || obj.Data["values.yaml"] != "v1" || obj.ResourceVersion != "7" {
					t.Errorf("adopted: labels %v data %v rv %q", obj.Labels, obj.Data, obj.ResourceVersion)
				}
			}},
		{name: "source missing, no copy: nothing to copy", obs: Observed{Namespace: wc}, action: ActionNone, state: StateAbsent},
		{name: "source deleted: copy kept and marked stale",
			obs:    Observed{Namespace: wc, Copy: ourCopy("wc1", "v1")},
			action: ActionMarkStale, state: StateStale,
			check: func(t *testing.T, obj *corev1.ConfigMap) {
				if obj.Annotations[AnnotationStaleSince] != "2026-12-02T10:00:00Z" {
					t.Errorf("stale annotation %q", obj.Annotations[AnnotationStaleSince])
				}
				if obj.Data["values.yaml"] != "v1" || obj.ResourceVersion != "42" {
					t.Errorf("data must be kept, the write conditional: %v rv %q", obj.Data, obj.ResourceVersion)
				}
			}},
		{name: "source still missing, copy already stale: nothing", obs: Observed{Namespace: wc, Copy: staleCopy}, action: ActionNone, state: StateStale},
		{name: "source missing, object not ours, --adopt: not adopted without data",
			obs: Observed{Namespace: wc, Copy: unmanaged}, adopt: true, action: ActionNone, state: StateConflict},
		// Without the source, nothing proves the copy is ours: kept.
		{name: "source missing, namespace lost the label: copy kept",
			obs: Observed{Namespace: plain, Copy: ourCopy("other", "v1")}, action: ActionNone, state: StateConflict},
		// Labels copied by hand prove nothing.
		{name: "labels copied by hand, unselected namespace: not deleted",
			obs: Observed{Namespace: plain, Source: source("v1"), Copy: edit(ourCopy("other", "mine"), func(cm *corev1.ConfigMap) {
				delete(cm.Annotations, AnnotationOwnerProof)
			})}, action: ActionNone, state: StateConflict},
		{name: "the proof of another namespace's copy, copied by hand: not deleted",
			obs: Observed{Namespace: plain, Source: source("v1"), Copy: edit(ourCopy("other", "v1"), func(cm *corev1.ConfigMap) {
				cm.Annotations[AnnotationOwnerProof] = ourCopy("wc1", "v1").Annotations[AnnotationOwnerProof]
			})}, action: ActionNone, state: StateConflict},
		{name: "a copy of another source (recreated since): not deleted",
			obs:    Observed{Namespace: plain, Source: edit(source("v1"), func(cm *corev1.ConfigMap) { cm.UID = "new-uid" }), Copy: ourCopy("other", "v1")},
			action: ActionNone, state: StateConflict},
		{name: "labels copied by hand, immutable: not deleted",
			obs: Observed{Namespace: wc, Source: source("v2"), Copy: edit(ourCopy("wc1", "v1"), func(cm *corev1.ConfigMap) {
				cm.Immutable = ptr.To(true)
				delete(cm.Annotations, AnnotationOwnerProof)
			})}, action: ActionNone, state: StateConflict},
		{name: "copy of an older osimages (no source uid), selected: updated with it",
			obs: Observed{Namespace: wc, Source: source("v1"), Copy: edit(ourCopy("wc1", "v1"), func(cm *corev1.ConfigMap) {
				delete(cm.Annotations, AnnotationOwnerProof)
			})}, action: ActionUpdate, state: StateOutOfSync,
			check: func(t *testing.T, obj *corev1.ConfigMap) {
				if obj.Annotations[AnnotationOwnerProof] != OwnerProof(rule, source("v1"), "wc1") || !strings.HasPrefix(obj.Annotations[AnnotationOwnerProof], "hmac-sha256:") {
					t.Errorf("annotations %v", obj.Annotations)
				}
			}},
		{name: "source back: stale copy follows it again",
			obs:    Observed{Namespace: wc, Source: source("v3"), Copy: staleCopy},
			action: ActionUpdate, state: StateOutOfSync,
			check: func(t *testing.T, obj *corev1.ConfigMap) {
				if _, stale := obj.Annotations[AnnotationStaleSince]; stale || obj.Data["values.yaml"] != "v3" {
					t.Errorf("annotations %v data %v", obj.Annotations, obj.Data)
				}
			}},
		{name: "source back unchanged: stale mark removed",
			obs:    Observed{Namespace: wc, Source: source("v1"), Copy: staleCopy},
			action: ActionUpdate, state: StateOutOfSync},
		{name: "immutable copy that differs: deleted to be created again",
			obs: Observed{Namespace: wc, Source: source("v2"), Copy: edit(ourCopy("wc1", "v1"), func(cm *corev1.ConfigMap) {
				cm.Immutable = ptr.To(true)
			})},
			action: ActionDelete, state: StateOutOfSync},
		{name: "immutable copy in sync: nothing",
			obs: Observed{Namespace: wc, Source: source("v1"), Copy: edit(ourCopy("wc1", "v1"), func(cm *corev1.ConfigMap) {
				cm.Immutable = ptr.To(true)
			})},
			action: ActionNone, state: StateInSync},
		{name: "the source's own namespace matches and the target is the source: never written",
			rule: Rule{Name: "self", Source: rule.Source, Target: "served", Selector: labels.Everything()},
			obs:  Observed{Namespace: namespace("sylva-system", nil), Source: source("v1"), Copy: source("v1")}, adopt: true,
			action: ActionNone, state: StateAbsent},
		{name: "empty selector selects every namespace",
			rule: Rule{Name: "all", Source: rule.Source, Target: "served-copy", Selector: labels.Everything()},
			obs:  Observed{Namespace: plain, Source: source("v1")}, action: ActionCreate, state: StateOutOfSync},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := rule
			if tt.rule.Name != "" {
				r = tt.rule
			}
			before := deepCopyObserved(tt.obs)
			d := Decide(r, tt.obs, tt.adopt, now)
			if d.Action != tt.action || d.State != tt.state {
				t.Fatalf("got %s/%s (%s), want %s/%s", d.Action, d.State, d.Reason, tt.action, tt.state)
			}
			if d.Reason == "" {
				t.Error("no reason given")
			}
			if !equality.Semantic.DeepEqual(before, tt.obs) {
				t.Error("Decide modified its input")
			}
			if (d.Action == ActionNone) != (d.Object == nil) {
				t.Fatalf("action %s with object %v", d.Action, d.Object)
			}
			if d.Object != nil {
				if d.Object.Name != r.Target {
					t.Errorf("object name %q", d.Object.Name)
				}
				if d.Object.Namespace == r.Source.Namespace && d.Object.Name == r.Source.Name {
					t.Error("decided to write the source")
				}
				if len(d.Object.ManagedFields) != 0 {
					t.Error("managedFields sent back")
				}
			}
			if tt.check != nil {
				tt.check(t, d.Object)
			}
		})
	}
}

func edit2(ns *corev1.Namespace, f func(*corev1.Namespace)) *corev1.Namespace {
	out := ns.DeepCopy()
	f(out)
	return out
}

func deepCopyObserved(o Observed) Observed {
	return Observed{Namespace: o.Namespace.DeepCopy(), Source: o.Source.DeepCopy(), Copy: o.Copy.DeepCopy()}
}

// Every write is decided from a copy that then converges: applying the
// decision and deciding again gives nothing to do.
func TestDecideConverges(t *testing.T) {
	wc := namespace("wc1", map[string]string{"wc": ""})
	starts := []*corev1.ConfigMap{
		nil,
		ourCopy("wc1", "old"),
		edit(ourCopy("wc1", "v1"), func(cm *corev1.ConfigMap) { cm.Annotations[AnnotationStaleSince] = "x" }),
		edit(ourCopy("wc1", "v1"), func(cm *corev1.ConfigMap) { cm.Labels = nil; cm.Annotations = nil }),
	}
	for i, cp := range starts {
		d := Decide(rule, Observed{Namespace: wc, Source: source("v1"), Copy: cp}, true, now)
		if d.Action != ActionCreate && d.Action != ActionUpdate {
			t.Fatalf("start %d: %s", i, d.Action)
		}
		again := Decide(rule, Observed{Namespace: wc, Source: source("v1"), Copy: d.Object}, false, now)
		if again.Action != ActionNone || again.State != StateInSync {
			t.Errorf("start %d: after the write, %s/%s (%s)", i, again.Action, again.State, again.Reason)
		}
	}
}

func TestSourceHash(t *testing.T) {
	cm := func(data map[string]string, bin map[string][]byte) *corev1.ConfigMap {
		return &corev1.ConfigMap{Data: data, BinaryData: bin}
	}
	a := SourceHash(cm(map[string]string{"a": "1", "b": "2"}, nil))
	if !strings.HasPrefix(a, "sha256:") || len(a) != len("sha256:")+64 {
		t.Fatalf("hash %q", a)
	}
	same := SourceHash(cm(map[string]string{"b": "2", "a": "1"}, map[string][]byte{}))
	if a != same {
		t.Error("hash depends on map order or on nil versus empty")
	}
	distinct := []string{
		a,
		SourceHash(cm(map[string]string{"a": "1", "b": "3"}, nil)),
		SourceHash(cm(map[string]string{"a": "1b", "": "2"}, nil)),
		SourceHash(cm(map[string]string{"a": "1"}, map[string][]byte{"b": []byte("2")})),
		SourceHash(cm(nil, nil)),
	}
	seen := map[string]int{}
	for i, h := range distinct {
		if j, dup := seen[h]; dup {
			t.Errorf("contents %d and %d hash the same", j, i)
		}
		seen[h] = i
	}
}
