package metal3

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/cache"
)

func machineWithImage(name, url, checksum, checksumType string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": Group + "/v1beta1", "kind": KindMachine,
		"metadata": map[string]any{"name": name, "namespace": "ns", "resourceVersion": "7",
			"labels": map[string]any{"a": "b"}, "annotations": map[string]any{"big": strings.Repeat("x", 1000)}},
		"spec": map[string]any{
			"providerID": "metal3://x",
			"image":      map[string]any{"url": url, "checksum": checksum, "checksumType": checksumType, "diskFormat": "raw"},
		},
		"status": map[string]any{"addresses": []any{map[string]any{"address": "10.0.0.1"}}},
	}}
}

// Transform slims the Metal3 kinds that reference images, to their name,
// resource version and image fields, and leaves any other object alone:
// another kind of the same group, another group, a typed object.
func TestTransform(t *testing.T) {
	m := machineWithImage("m0", "http://h/images/x", "c", "md5")
	got, err := Transform(m)
	if err != nil {
		t.Fatal(err)
	}
	slim := got.(*unstructured.Unstructured)
	want := map[string]any{
		"kind":     KindMachine,
		"metadata": map[string]any{"name": "m0", "namespace": "ns", "resourceVersion": "7"},
		"spec":     map[string]any{"image": map[string]any{"url": "http://h/images/x", "checksum": "c", "checksumType": "md5"}},
	}
	if !reflect.DeepEqual(slim.Object, want) {
		t.Errorf("slimmed %v\nwant %v", slim.Object, want)
	}

	for name, obj := range map[string]any{
		"another kind of the group": &unstructured.Unstructured{Object: map[string]any{"apiVersion": Group + "/v1beta1", "kind": "Metal3DataTemplate", "status": map[string]any{"x": 1}}},
		"another group":             &unstructured.Unstructured{Object: map[string]any{"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": KindMachine, "status": map[string]any{"x": 1}}},
		"a typed object":            &cache.DeletedFinalStateUnknown{Key: "k"},
	} {
		if got, err := Transform(obj); err != nil || got != obj {
			t.Errorf("%s: transformed into %v, %v", name, got, err)
		}
	}
}

// SlimObject gives a list item, which comes without a kind, its kind, and
// an object without an image block no spec at all.
func TestSlimObjectOfAListItem(t *testing.T) {
	item := machineWithImage("m1", "", "", "")
	unstructured.RemoveNestedField(item.Object, "kind")
	unstructured.RemoveNestedField(item.Object, "spec", "image")
	slim := SlimObject(item, KindMachine).(*unstructured.Unstructured)
	if slim.GetKind() != KindMachine || item.GetKind() != KindMachine || slim.GetName() != "m1" {
		t.Errorf("kind %q (item %q), name %q", slim.GetKind(), item.GetKind(), slim.GetName())
	}
	if _, ok := slim.Object["spec"]; ok {
		t.Errorf("an object without image kept a spec: %v", slim.Object)
	}
	if got := SlimObject("not an object", KindMachine); got != "not an object" {
		t.Errorf("a non-object became %v", got)
	}
}

// ServedFile names the file Ironic asks osimages for: an image URL of
// osimages, its filename unescaped; a checksum file, another path or an
// unparsable URL name none.
func TestServedFile(t *testing.T) {
	sha := strings.Repeat("0f", 32)
	cases := []struct {
		url, filename string
	}{
		{"http://osimages:8080/images/" + sha + "/ubuntu.raw", "ubuntu.raw"},
		{"https://osimages/images/" + sha + "/a%20b%23c.qcow2?x=1", "a b#c.qcow2"},
		{"http://osimages/images/" + sha + "/ubuntu.raw.sha256sum", ""},
		{"http://osimages/images/" + sha + "/ubuntu.raw.md5sum", ""},
		{"http://osimages/images/" + sha + "/a%2Fb.raw", ""},
		{"http://osimages/other/" + sha + "/ubuntu.raw", ""},
		{"http://osimages/images/" + sha[:63] + "/ubuntu.raw", ""},
		{"http://osimages/images/" + sha + "/%zz.raw", ""},
		{"://no scheme/images/" + sha + "/ubuntu.raw", ""},
	}
	for _, tc := range cases {
		got, filename, ok := Image{URL: tc.url, Checksum: sha}.ServedFile()
		if ok != (tc.filename != "") || filename != tc.filename || (ok && got.String() != sha) {
			t.Errorf("%s: %q %q %v, want filename %q", tc.url, got, filename, ok, tc.filename)
		}
	}
}

// The tracker follows each object's image: an object moving to an image
// that is not osimages' (another checksum type and URL) no longer holds
// its old one, two objects hold one image until both are gone, and a
// deletion seen only as a tombstone still lets go.
func TestReferencesFollowsChangesAndTombstones(t *testing.T) {
	r := NewReferences(nil, nil, nil)
	a, b := strings.Repeat("a", 64), strings.Repeat("b", 64)
	m0 := machineWithImage("m0", "http://osimages/images/"+a+"/x.raw", a, "sha256")
	m1 := machineWithImage("m1", "http://mirror/x.raw", a, "sha256")
	r.set(m0)
	r.set(m1)
	held := func(sha string) string {
		parsed, _ := Image{Checksum: sha}.SHA256()
		return strings.Join(r.ReferencedBy(parsed), ",")
	}
	if got := held(a); got != "Metal3Machine ns/m0,Metal3Machine ns/m1" {
		t.Errorf("a held by %s", got)
	}

	r.set(machineWithImage("m1", "http://mirror/x.raw", strings.Repeat("c", 32), "md5"))
	if got := held(a); got != "Metal3Machine ns/m0" {
		t.Errorf("after m1 moved to an image of its own, a held by %s", got)
	}
	r.set(machineWithImage("m0", "http://osimages/images/"+b+"/x.raw", "", ""))
	if got, gotB := held(a), held(b); got != "" || gotB != "Metal3Machine ns/m0" {
		t.Errorf("after m0 moved to b: a held by %q, b by %q", got, gotB)
	}
	r.remove(cache.DeletedFinalStateUnknown{Key: "ns/m0", Obj: machineWithImage("m0", "", "", "")})
	r.remove("not an object")
	r.set("not an object")
	if got := held(b); got != "" || len(r.byRef) != 0 || len(r.bySHA) != 0 {
		t.Errorf("after the tombstone, b held by %q; left %v %v", got, r.byRef, r.bySHA)
	}
}

// errMapper fails every lookup but those it knows, as a mapper does when
// discovery fails.
type errMapper struct {
	meta.RESTMapper
	err error
}

func (m errMapper) RESTMapping(gk schema.GroupKind, versions ...string) (*meta.RESTMapping, error) {
	return nil, m.err
}

// ServedKinds lists only the kinds served, each in its preferred version,
// and reports a lookup that fails for another reason than a missing kind,
// naming the kind.
func TestServedKinds(t *testing.T) {
	mapper := meta.NewDefaultRESTMapper([]schema.GroupVersion{{Group: Group, Version: "v1beta2"}})
	mapper.Add(schema.GroupVersionKind{Group: Group, Version: "v1beta2", Kind: KindMachine}, meta.RESTScopeNamespace)
	kinds, err := ServedKinds(mapper)
	if err != nil || len(kinds) != 1 || kinds[0] != (schema.GroupVersionKind{Group: Group, Version: "v1beta2", Kind: KindMachine}) {
		t.Errorf("only Metal3Machine served: %v, %v", kinds, err)
	}
	down := errors.New("discovery is down")
	kinds, err = ServedKinds(errMapper{err: down})
	if !errors.Is(err, down) || !strings.Contains(err.Error(), KindMachineTemplate) || kinds != nil {
		t.Errorf("a failing mapper: %v, %v", kinds, err)
	}
}
