package servedset

import (
	"errors"
	"strings"
	"testing"

	"github.com/sylva-projects/osimages/internal/osimage"
)

func TestRecordsTryEachRecordOncePerRound(t *testing.T) {
	bad := Record{Key: "bad", Desc: osimage.Descriptor{URI: "oci://r/x:wrong"}, Namespaces: []string{"tenant-a"}}
	good := Record{Key: "good", Desc: osimage.Descriptor{URI: "oci://r/x:1"}, Namespaces: []string{"tenant-b", "not-needing"}}
	w := Wanted{SHA256: osimage.SHA256(strings.Repeat("a", 64)), Key: bad.Key, Desc: bad.Desc, Records: []Record{bad, good}, ForNamespaces: []string{"tenant-a", "tenant-b"}}
	var r Records
	first := r.Next(w)
	if first.Key != "bad" {
		t.Fatalf("first attempt from %s; want bad", first.Key)
	}
	next, ok := r.Failed(w, first, errors.New("manifest unknown"))
	if !ok || next.Key != "good" || r.Next(w).Key != "good" {
		t.Fatalf("after bad failed: next %s %v, attempt %s; want good", next.Key, ok, r.Next(w).Key)
	}
	if _, ok := r.Failed(w, r.Next(w), errors.New("connection refused")); ok {
		t.Fatal("a record left after both failed")
	}
	// Each needing namespace hears its own record's failure, and only a
	// needing namespace.
	got := map[string]string{}
	for _, ref := range r.Refusals(w, "") {
		if ref.Reason != osimage.RefusedDownload {
			t.Errorf("reason %s", ref.Reason)
		}
		got[ref.Namespace] = ref.Message
	}
	if len(got) != 2 || !strings.Contains(got["tenant-a"], "manifest unknown") || !strings.Contains(got["tenant-b"], "connection refused") {
		t.Errorf("refusals %v; want tenant-a's manifest unknown and tenant-b's connection refused", got)
	}
	// Once every record failed, a new round starts from the first.
	if k := r.Next(w).Key; k != "bad" {
		t.Errorf("new round from %s; want bad", k)
	}
	// A need of one record has no round: its failure is the image's reason.
	one := Wanted{SHA256: w.SHA256, Records: []Record{good}, ForNamespaces: []string{"tenant-b"}}
	var r1 Records
	if _, ok := r1.Failed(one, r1.Next(one), errors.New("x")); ok {
		t.Error("a second record for a need of one")
	}
	if refs := r1.Refusals(one, strings.Repeat("y", 600)); len(refs) != 1 || !strings.HasSuffix(refs[0].Message, "...") || len(refs[0].Message) > 700 {
		t.Errorf("one record's refusal %+v; want the image's reason, clipped", refs)
	}
}
