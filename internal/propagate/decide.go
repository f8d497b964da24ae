// Package propagate keeps copies of a source ConfigMap in every namespace a
// label selector matches, the way Sylva's Kyverno clone policy did (contract
// §7), with a few differences on purpose (see Decide).
//
// Decide is the whole policy, as a pure function of what is observed; the
// controller in this package only reads the state from its informers, calls
// Decide, and writes the result.
package propagate

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// The marks osimages puts on its copies. LabelRule is the ownership mark: an
// object without it was not created by osimages and is never overwritten,
// unless adopting.
const (
	LabelRule            = "propagate.osimages.sylva-project.org/rule"
	LabelSourceNamespace = "propagate.osimages.sylva-project.org/source-namespace"
	LabelSourceName      = "propagate.osimages.sylva-project.org/source-name"
	// AnnotationSourceHash is the hash of the source data the copy carries
	// (SourceHash), so that an operator can tell which version a namespace
	// has without comparing documents.
	AnnotationSourceHash = "propagate.osimages.sylva-project.org/source-hash"
	// AnnotationStaleSince is set, to the RFC 3339 time the source was
	// found missing, on copies kept while their source is gone.
	AnnotationStaleSince = "propagate.osimages.sylva-project.org/stale-since"
	// AnnotationOwnerProof proves that osimages made a copy: an HMAC of the
	// rule, namespace and name of the copy keyed with the UID of the live
	// source (OwnerProof). Labels, and this annotation, can be copied by
	// hand, but the proof of one namespace does not hold in another, and
	// a tenant cannot compute it without reading the source in its own
	// namespace. A copy is deleted only when it carries the proof (Owned).
	AnnotationOwnerProof = "propagate.osimages.sylva-project.org/owner-proof"
)

// Action is the write a Decision asks for.
type Action string

const (
	ActionNone      Action = "none"
	ActionCreate    Action = "create"
	ActionUpdate    Action = "update"
	ActionDelete    Action = "delete"
	ActionMarkStale Action = "mark_stale"
)

// State is what the object of the target name is, before the action.
type State string

const (
	// StateAbsent: no copy is wanted here, or none can be made (no
	// source), and none of ours is here.
	StateAbsent    State = "absent"
	StateInSync    State = "in_sync"
	StateOutOfSync State = "out_of_sync"
	// StateStale: a copy kept while its source is missing.
	StateStale State = "stale"
	// StateConflict: an object osimages did not create holds the name.
	StateConflict State = "conflict"
)

// Observed is what the controller saw of one (rule, namespace) pair. A nil
// field means the object does not exist.
type Observed struct {
	Namespace *corev1.Namespace
	Source    *corev1.ConfigMap
	// Copy is whatever object holds the target name in the namespace, ours
	// or not.
	Copy *corev1.ConfigMap
	// For a rule with a Catalog: Served is the source read as a served
	// set (read from Source when nil), and Picks what the namespace can
	// use.
	Served *ServedSource
	Picks  Picks
}

// Decision is what to do about one (rule, namespace) pair.
type Decision struct {
	Action Action
	State  State
	// Object is the ConfigMap to create, or the full object to update. For
	// an update it keeps the resourceVersion it was decided from, so that
	// the write fails rather than overwrites a change made since.
	Object *corev1.ConfigMap
	// Reason says why, for logs and events.
	Reason string
}

// Decide says what the object named r.Target in namespace o.Namespace must
// become. It never modifies its inputs.
//
// Where it differs from Kyverno's clone with synchronize:
//   - source deleted: copies are kept and marked stale (AnnotationStaleSince),
//     not deleted, and follow the source again when it is back;
//   - an object of the target name that osimages did not create is left alone
//     (StateConflict) unless adopt is set;
//   - the source is never written to.
func Decide(r Rule, o Observed, adopt bool, now time.Time) Decision {
	ns := o.Namespace
	if ns == nil || ns.DeletionTimestamp != nil || ns.Status.Phase == corev1.NamespaceTerminating {
		// The namespace takes its objects with it, and refuses new ones.
		return Decision{Action: ActionNone, State: StateAbsent, Reason: "namespace is gone or terminating"}
	}
	if ns.Name == r.Source.Namespace && r.Target == r.Source.Name {
		return Decision{Action: ActionNone, State: StateAbsent, Reason: "the target is the source itself, which is never written"}
	}
	cp := o.Copy
	ours := cp != nil && cp.Labels[LabelRule] != ""
	if !r.Selector.Matches(labels.Set(ns.Labels)) {
		// Only this rule's copies go: a copy left by a rule since removed
		// from the config stays where it is.
		if cp != nil && cp.Labels[LabelRule] == r.Name {
			if !Owned(r, o.Source, cp) {
				return Decision{Action: ActionNone, State: StateConflict, Reason: unproven(r, o.Source, cp)}
			}
			return Decision{Action: ActionDelete, State: StateOutOfSync, Object: cp, Reason: "namespace no longer matches the rule's selector"}
		}
		return Decision{Action: ActionNone, State: StateAbsent, Reason: "namespace does not match the rule's selector"}
	}
	if cp != nil && !ours && !adopt {
		return Decision{Action: ActionNone, State: StateConflict, Reason: fmt.Sprintf("ConfigMap %s/%s was not created by osimages (no label %s); not overwriting it (--adopt would)", cp.Namespace, cp.Name, LabelRule)}
	}
	if o.Source == nil {
		switch {
		case cp == nil:
			return Decision{Action: ActionNone, State: StateAbsent, Reason: fmt.Sprintf("source %s not found; nothing to copy", r.Source)}
		case !ours:
			// Adopting writes our data over theirs; with no data to write,
			// the object stays as it is.
			return Decision{Action: ActionNone, State: StateConflict, Reason: fmt.Sprintf("source %s not found; not adopting without data", r.Source)}
		case cp.Annotations[AnnotationStaleSince] != "":
			return Decision{Action: ActionNone, State: StateStale, Reason: fmt.Sprintf("source %s not found; copy kept", r.Source)}
		}
		stale := cp.DeepCopy()
		stale.ManagedFields = nil
		if stale.Annotations == nil {
			stale.Annotations = map[string]string{}
		}
		stale.Annotations[AnnotationStaleSince] = now.UTC().Format(time.RFC3339)
		return Decision{Action: ActionMarkStale, State: StateStale, Object: stale, Reason: fmt.Sprintf("source %s not found; copy kept and marked stale", r.Source)}
	}
	want, err := wanted(r, o)
	if err != nil {
		return Decision{Action: ActionNone, State: StateOutOfSync, Reason: fmt.Sprintf("making the copy of source %s: %v", r.Source, err)}
	}
	if cp == nil {
		return Decision{Action: ActionCreate, State: StateOutOfSync, Object: newCopy(r, o.Source, ns.Name, want), Reason: "copy missing"}
	}
	if cp.Immutable != nil && *cp.Immutable {
		// An immutable ConfigMap refuses new data; deleting it lets the
		// next pass create it afresh.
		if inSync(r, o.Source, cp, want) {
			return Decision{Action: ActionNone, State: StateInSync, Reason: "copy in sync"}
		}
		if !Owned(r, o.Source, cp) {
			return Decision{Action: ActionNone, State: StateConflict, Reason: unproven(r, o.Source, cp) + " (it is immutable, so it cannot be updated)"}
		}
		return Decision{Action: ActionDelete, State: StateOutOfSync, Object: cp, Reason: "copy is immutable and differs from the source; recreating it"}
	}
	if inSync(r, o.Source, cp, want) {
		return Decision{Action: ActionNone, State: StateInSync, Reason: "copy in sync"}
	}
	reason := "copy differs from the source"
	if !ours {
		reason = "adopting an object osimages did not create"
	} else if cp.Annotations[AnnotationStaleSince] != "" {
		reason = "source is back"
	}
	return Decision{Action: ActionUpdate, State: StateOutOfSync, Object: updatedCopy(r, o.Source, cp, want), Reason: reason}
}

// Owned says whether cp is provably a copy osimages made for r from src:
// it carries r's labels and the UID of the live source. Only such a copy
// is ever deleted.
func Owned(r Rule, src, cp *corev1.ConfigMap) bool {
	if src == nil || cp == nil || src.UID == "" {
		return false
	}
	for k, v := range ownLabels(r) {
		if cp.Labels[k] != v {
			return false
		}
	}
	return hmac.Equal([]byte(cp.Annotations[AnnotationOwnerProof]), []byte(OwnerProof(r, src, cp.Namespace)))
}

// OwnerProof is the value of AnnotationOwnerProof on the copy of r in
// namespace made from src ("" when src has no UID yet).
func OwnerProof(r Rule, src *corev1.ConfigMap, namespace string) string {
	if src == nil || src.UID == "" {
		return ""
	}
	mac := hmac.New(sha256.New, []byte(src.UID))
	mac.Write([]byte(r.Name + "\x00" + namespace + "\x00" + r.Target))
	return "hmac-sha256:" + hex.EncodeToString(mac.Sum(nil))
}

func unproven(r Rule, src, cp *corev1.ConfigMap) string {
	why := fmt.Sprintf("its annotation %s is not the proof made from source %s for this namespace", AnnotationOwnerProof, r.Source)
	if src == nil {
		why = fmt.Sprintf("source %s is missing, so the proof cannot be checked", r.Source)
	}
	return fmt.Sprintf("ConfigMap %s/%s carries rule %s's labels, but nothing proves osimages made it (%s); not deleting it: delete it by hand if it is a stale copy",
		cp.Namespace, cp.Name, r.Name, why)
}

// SourceHash identifies the data of a ConfigMap: equal data, equal hash,
// whatever the key order.
func SourceHash(cm *corev1.ConfigMap) string {
	h := sha256.New()
	// Length-prefixed fields, so that no two different contents write the
	// same byte stream.
	write := func(s []byte) {
		_ = binary.Write(h, binary.BigEndian, uint64(len(s)))
		h.Write(s)
	}
	for _, k := range slices.Sorted(maps.Keys(cm.Data)) {
		write([]byte("d:" + k))
		write([]byte(cm.Data[k]))
	}
	for _, k := range slices.Sorted(maps.Keys(cm.BinaryData)) {
		write([]byte("b:" + k))
		write(cm.BinaryData[k])
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

func ownLabels(r Rule) map[string]string {
	return map[string]string{
		LabelRule:            r.Name,
		LabelSourceNamespace: r.Source.Namespace,
		LabelSourceName:      r.Source.Name,
	}
}

// content is what a copy carries.
type content struct {
	data   map[string]string
	binary map[string][]byte
	// hash is the value of AnnotationSourceHash.
	hash string
	// picks is the value of AnnotationPicks, "" on a whole copy.
	picks string
}

// wanted is the content of the copy of o.Source in o.Namespace: the
// source's data, or for a rule with a Catalog, what the namespace can use
// of it (ServedSource.Filtered). The hash is that of the data carried, so
// that a source change that leaves a filtered copy as it was does not
// rewrite it.
func wanted(r Rule, o Observed) (content, error) {
	if r.Catalog == "" {
		return content{data: o.Source.Data, binary: o.Source.BinaryData, hash: SourceHash(o.Source)}, nil
	}
	served := o.Served
	if served == nil {
		s := ReadServedSource(o.Source)
		served = &s
	}
	data, binary, note, err := served.Filtered(o.Namespace.Name, o.Picks)
	if err != nil {
		return content{}, err
	}
	return content{data: data, binary: binary, hash: SourceHash(&corev1.ConfigMap{Data: data, BinaryData: binary}), picks: note}, nil
}

func newCopy(r Rule, src *corev1.ConfigMap, namespace string, want content) *corev1.ConfigMap {
	cp := &corev1.ConfigMap{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{
			Name:        r.Target,
			Namespace:   namespace,
			Labels:      ownLabels(r),
			Annotations: map[string]string{AnnotationSourceHash: want.hash, AnnotationOwnerProof: OwnerProof(r, src, namespace)},
		},
		Data:       maps.Clone(want.data),
		BinaryData: cloneBinary(want.binary),
	}
	if want.picks != "" {
		cp.Annotations[AnnotationPicks] = want.picks
	}
	return cp
}

// updatedCopy keeps what others added to the copy's metadata (labels,
// annotations, owners), and puts back ours and the data.
func updatedCopy(r Rule, src, cp *corev1.ConfigMap, want content) *corev1.ConfigMap {
	out := cp.DeepCopy()
	out.ManagedFields = nil
	if out.Labels == nil {
		out.Labels = map[string]string{}
	}
	maps.Copy(out.Labels, ownLabels(r))
	if out.Annotations == nil {
		out.Annotations = map[string]string{}
	}
	out.Annotations[AnnotationSourceHash] = want.hash
	out.Annotations[AnnotationOwnerProof] = OwnerProof(r, src, cp.Namespace)
	delete(out.Annotations, AnnotationStaleSince)
	delete(out.Annotations, AnnotationPicks)
	if want.picks != "" {
		out.Annotations[AnnotationPicks] = want.picks
	}
	out.Data = maps.Clone(want.data)
	out.BinaryData = cloneBinary(want.binary)
	return out
}

func inSync(r Rule, src, cp *corev1.ConfigMap, want content) bool {
	for k, v := range ownLabels(r) {
		if cp.Labels[k] != v {
			return false
		}
	}
	if cp.Annotations[AnnotationStaleSince] != "" || cp.Annotations[AnnotationSourceHash] != want.hash || cp.Annotations[AnnotationOwnerProof] != OwnerProof(r, src, cp.Namespace) ||
		cp.Annotations[AnnotationPicks] != want.picks {
		return false
	}
	return maps.Equal(cp.Data, want.data) && maps.EqualFunc(cp.BinaryData, want.binary, bytes.Equal)
}

func cloneBinary(m map[string][]byte) map[string][]byte {
	if m == nil {
		return nil
	}
	out := make(map[string][]byte, len(m))
	for k, v := range m {
		out[k] = bytes.Clone(v)
	}
	return out
}
