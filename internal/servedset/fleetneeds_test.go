package servedset

import (
	"slices"
	"strings"
	"testing"

	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/values"
)

func sha(c byte) osimage.SHA256 { return osimage.SHA256(strings.Repeat(string(c), 64)) }

// needsOf keeps the fleet's needs of a served set.
func needsOf(served map[osimage.SHA256]Wanted) map[osimage.SHA256]Wanted {
	out := map[osimage.SHA256]Wanted{}
	for s, w := range served {
		if w.IsNeed() {
			out[s] = w
		}
	}
	return out
}

func need(s osimage.SHA256, uri string, size string, namespaces ...string) osimage.FleetNeed {
	img := osimage.Image{osimage.FieldSHA256: string(s), osimage.FieldURI: uri, osimage.FieldFilename: "disk.qcow2"}
	if size != "" {
		img[osimage.FieldSize] = size
	}
	return osimage.FleetNeed{SHA256: s, Namespaces: namespaces,
		Sources: []osimage.NeedSource{{Key: "k-" + string(s[:1]), Image: img, Namespaces: namespaces}}}
}

var fleetMgmtValues = values.Values{"os_images_oci_registries": map[string]any{
	"sylva":    map[string]any{"url": "oci://Registry.Example.org:443/sylva"},
	"disabled": map[string]any{"url": "oci://off.example.org/x", "enabled": false},
}}

func TestFleetNeedsPolicy(t *testing.T) {
	needs := osimage.FleetNeeds{Images: []osimage.FleetNeed{
		need(sha('a'), "oci://registry.example.org/sylva/path:1.0", "10", "wc1"),
		need(sha('1'), "oci://registry.example.org/other/evil:1.0", "10", "wc1"),
		need(sha('2'), "oci://registry.example.org/sylva-evil/x:1.0", "10", "wc1"),
		need(sha('3'), "oci://registry.example.org/sylva/../other/x:1.0", "10", "wc1"),
		need(sha('4'), "oci://registry.example.org/sylva/%2e%2e/other/x:1.0", "10", "wc1"),
		need(sha('b'), "oci://evil.example.org/sylva/x:1.0", "10", "wc1"),
		need(sha('c'), "oci://off.example.org/x/y:1", "10", "wc1"),
		need(sha('d'), "https://files.example.org/dib/x.qcow2", "10", "wc2"),
		need(sha('e'), "https://files.example.org.evil.com/dib/x.qcow2", "10", "wc2"),
		need(sha('f'), "https://files.example.org/dib/../../etc/x", "10", "wc2"),
		need(sha('0'), "oci://registry.example.org/already:1", "10", "wc1"),
		{SHA256: sha('9'), Namespaces: []string{"wc3"}},
	}}
	selected := map[osimage.SHA256]Wanted{sha('0'): {SHA256: sha('0'), Key: "mgmt"}}
	served, refused := FleetNeeds(fleetMgmtValues, needs, selected, nil, FleetPolicy{AllowPrefixes: []string{"https://files.example.org/dib/"}})
	added := needsOf(served)
	if len(added) != 2 || added[sha('a')].Key != "k-a" || added[sha('d')].Key != "k-d" {
		t.Fatalf("added: %v", added)
	}
	if w := served[sha('0')]; w.Key != "mgmt" || w.IsNeed() {
		t.Errorf("an image the management already selects is changed: %+v", w)
	}
	want := map[osimage.SHA256]string{
		sha('b'): "uri oci://evil.example.org/sylva/x:1.0 (record k-b) is under no registry url the management values declare (os_images_oci_registries: sylva (oci://Registry.Example.org:443/sylva)), and the image server pulls the fleet's needs only from under one, where its cosign key applies: publish the image under one of them, or ask the operator to declare its repository in the management values' os_images_oci_registries",
		sha('c'): "uri oci://off.example.org/x/y:1 (record k-c) is under no registry url",
		sha('1'): "uri oci://registry.example.org/other/evil:1.0 (record k-1) is under no registry url the management values declare (os_images_oci_registries: sylva (oci://Registry.Example.org:443/sylva))",
		sha('2'): "uri oci://registry.example.org/sylva-evil/x:1.0 (record k-2) is under no registry url",
		sha('3'): "the record k-3: uri oci://registry.example.org/sylva/../other/x:1.0 is no OCI image reference: ",
		sha('4'): "the record k-4: uri oci://registry.example.org/sylva/%2e%2e/other/x:1.0 is no OCI image reference: ",
		sha('e'): "is under no prefix allowed",
		sha('f'): "a .. segment",
		sha('9'): "no os-images-info",
	}
	if len(refused) != len(want) {
		t.Fatalf("refused: %+v", refused)
	}
	for _, r := range refused {
		if !strings.Contains(r.Message, want[r.SHA256]) {
			t.Errorf("%s: %q does not say %q", r.SHA256[:1], r.Message, want[r.SHA256])
		}
	}
}

func TestFleetNeedsQuotas(t *testing.T) {
	uri := "oci://registry.example.org/sylva/x:1"
	needs := osimage.FleetNeeds{Images: []osimage.FleetNeed{
		need(sha('c'), uri, "10", "wc1"),
		need(sha('a'), uri, "10", "wc1", "wc2"),
		need(sha('b'), uri, "10", "wc1"),
		need(sha('d'), uri, "10", "wc2"),
	}}
	served, refused := FleetNeeds(fleetMgmtValues, needs, nil, nil, FleetPolicy{MaxImages: 1})
	added := needsOf(served)
	// a (both), then b refused for wc1; c refused for wc1; d: wc2 is full.
	if len(added) != 1 || added[sha('a')].SHA256 == "" {
		t.Fatalf("added: %v", added)
	}
	if len(refused) != 3 {
		t.Fatalf("refused: %+v", refused)
	}
	for _, r := range refused {
		if r.Message != "quota of 1 images reached" || r.Reason != osimage.RefusedImages {
			t.Errorf("%+v", r)
		}
	}
	served, refused = FleetNeeds(fleetMgmtValues, needs, nil, nil, FleetPolicy{MaxBytes: 25})
	if added = needsOf(served); len(added) != 3 || len(refused) != 1 || refused[0].SHA256 != sha('c') || !strings.HasPrefix(refused[0].Message, "quota of 25 bytes reached") {
		t.Fatalf("bytes quota: added %d, refused %+v", len(added), refused)
	}
}

// A new need never evicts an image served already: what is served is
// admitted first, whatever its sha256.
func TestFleetNeedsKeepWhatIsServed(t *testing.T) {
	uri := "oci://registry.example.org/sylva/x:1"
	needs := osimage.FleetNeeds{Images: []osimage.FleetNeed{need(sha('b'), uri, "10", "wc1"), need(sha('a'), uri, "10", "wc1")}}
	stored := map[osimage.SHA256]int64{sha('b'): 10}
	added, refused := FleetNeeds(fleetMgmtValues, needs, nil, stored, FleetPolicy{MaxImages: 1})
	if _, ok := added[sha('b')]; !ok || len(added) != 1 || len(refused) != 1 || refused[0].SHA256 != sha('a') {
		t.Fatalf("added %v, refused %+v", added, refused)
	}
}

// record is a needing namespace's record of sha s.
func record(key string, s osimage.SHA256, uri, filename, size string, namespaces ...string) osimage.NeedSource {
	img := osimage.Image{osimage.FieldSHA256: string(s), osimage.FieldURI: uri, osimage.FieldFilename: filename}
	if size != "" {
		img[osimage.FieldSize] = size
	}
	return osimage.NeedSource{Key: key, Image: img, Namespaces: namespaces}
}

// A tenant that gives the victim's sha256 another filename, under a key
// that sorts first, or a record that names a tag that does not exist,
// neither moves the victim's URL nor blocks its image: every filename of
// every admitted namespace is served, and every admitted record is kept,
// to be tried in turn (issue 23, item 1).
func TestFleetNeedsOneTenantCannotChangeAnothersImage(t *testing.T) {
	victim := record("ubuntu", sha('a'), "oci://registry.example.org/sylva/ubuntu:1", "good.raw", "10", "victim")
	evil := record("aaa", sha('a'), "oci://registry.example.org/sylva/ubuntu:does-not-exist", "evil.raw", "10", "evil")
	needs := osimage.FleetNeeds{Images: []osimage.FleetNeed{{
		SHA256: sha('a'), Sources: []osimage.NeedSource{evil, victim}, Namespaces: []string{"evil", "victim"},
		Filenames: map[string][]string{"victim": {"good.raw", "older.raw"}, "evil": {"evil.raw"}},
	}}}
	served, refused := FleetNeeds(fleetMgmtValues, needs, nil, nil, FleetPolicy{})
	if len(refused) != 0 {
		t.Fatalf("refused: %+v", refused)
	}
	w := served[sha('a')]
	if strings.Join(w.ServedAs(), ",") != "evil.raw,good.raw,older.raw" {
		t.Errorf("filenames: %v: the victim's URL must answer", w.ServedAs())
	}
	if len(w.Records) != 2 || w.Key != w.Records[0].Key {
		t.Fatalf("records: %+v", w.Records)
	}
	keys := []string{w.Records[0].Key, w.Records[1].Key}
	if !slices.Contains(keys, "ubuntu") || !slices.Contains(keys, "aaa") {
		t.Errorf("records tried: %v", keys)
	}
	if strings.Join(w.ForNamespaces, ",") != "evil,victim" {
		t.Errorf("served for %v", w.ForNamespaces)
	}

	// The management cluster selects the image: its record and key stay,
	// the needing namespaces only add the names their URLs ask for.
	mgmt := map[osimage.SHA256]Wanted{sha('a'): {SHA256: sha('a'), Key: "mgmt-ubuntu", Filenames: []string{"mgmt.raw"},
		Desc: osimage.Descriptor{Filename: "mgmt.raw", URI: "oci://registry.example.org/sylva/ubuntu:1"}}}
	served, _ = FleetNeeds(fleetMgmtValues, needs, mgmt, nil, FleetPolicy{})
	w = served[sha('a')]
	if w.Key != "mgmt-ubuntu" || w.IsNeed() || len(w.Records) != 0 || w.Desc.Filename != "mgmt.raw" {
		t.Errorf("a need changed the management selection: %+v", w)
	}
	if strings.Join(w.ServedAs(), ",") != "evil.raw,good.raw,mgmt.raw,older.raw" {
		t.Errorf("filenames: %v", w.ServedAs())
	}
	if mgmt[sha('a')].Filenames[0] != "mgmt.raw" || len(mgmt[sha('a')].Filenames) != 1 {
		t.Error("the caller's selection was changed")
	}

	// A record the policy refuses is not kept, and its reason goes to its
	// own namespace only.
	evil.Image[osimage.FieldURI] = "oci://evil.example.org/x:1"
	needs.Images[0].Sources = []osimage.NeedSource{evil, victim}
	served, refused = FleetNeeds(fleetMgmtValues, needs, nil, nil, FleetPolicy{})
	if w := served[sha('a')]; len(w.Records) != 1 || w.Key != "ubuntu" {
		t.Errorf("records: %+v", w.Records)
	}
	if len(refused) != 0 {
		t.Errorf("the image is served for both: nothing to refuse, got %+v", refused)
	}
	needs.Images[0].Sources = []osimage.NeedSource{evil}
	needs.Images[0].Namespaces = []string{"evil"}
	_, refused = FleetNeeds(fleetMgmtValues, needs, nil, nil, FleetPolicy{})
	if len(refused) != 1 || refused[0].Namespace != "evil" || refused[0].Reason != osimage.RefusedRegistry {
		t.Errorf("refused: %+v", refused)
	}
}

// Under --max-storage the management selection is counted first, whatever
// the keys, and the needs share what it leaves fairly: one namespace
// cannot take it all, and a namespace refused for room is told so
// (issue 23, item 3).
func TestFleetNeedsLeaveTheManagementSelectionItsRoom(t *testing.T) {
	uri := "oci://registry.example.org/sylva/x:1"
	mgmtImg := osimage.Image{osimage.FieldSHA256: sha('m'), osimage.FieldSize: "600", osimage.FieldArchiveSize: "100", osimage.FieldFilename: "m.raw", osimage.FieldURI: uri}
	mgmt := map[osimage.SHA256]Wanted{sha('m'): {SHA256: sha('m'), Key: "zzz-mgmt", Desc: mgmtImg.Descriptor()}}
	var images []osimage.FleetNeed
	// greedy needs 4 images of 100 bytes under keys that sort first; fair
	// needs 2.
	for _, c := range []byte("abcd") {
		images = append(images, osimage.FleetNeed{SHA256: sha(c), Namespaces: []string{"greedy"},
			Sources: []osimage.NeedSource{record("aaa-"+string(c), sha(c), uri, "g.raw", "100", "greedy")}})
	}
	for _, c := range []byte("ef") {
		images = append(images, osimage.FleetNeed{SHA256: sha(c), Namespaces: []string{"fair"},
			Sources: []osimage.NeedSource{record("k-"+string(c), sha(c), uri, "f.raw", "100", "fair")}})
	}
	needs := osimage.FleetNeeds{Images: images}
	// 1000 bytes: 700 for the management image, 300 for the needs.
	served, refused := FleetNeeds(fleetMgmtValues, needs, mgmt, nil, FleetPolicy{Storage: 1000})
	if _, ok := served[sha('m')]; !ok {
		t.Fatal("the management image is not served")
	}
	per := map[string]int{}
	var total int64
	for _, w := range needsOf(served) {
		per[w.ForNamespaces[0]]++
		total += w.Desc.Size
	}
	if total > 300 {
		t.Errorf("the needs take %d bytes of the 300 the management image leaves", total)
	}
	if per["fair"] < 1 || per["greedy"] > 2 || per["fair"]+per["greedy"] != 3 {
		t.Errorf("shares: %v", per)
	}
	for _, r := range refused {
		if r.Reason != osimage.RefusedStorage || !strings.Contains(r.Message, "--max-storage") {
			t.Errorf("refusal: %+v", r)
		}
	}
	if len(refused) != 3 {
		t.Errorf("refused: %+v", refused)
	}

	// An image stored already stays before a new one; images kept on disk
	// for a grace period count as taken.
	stored := map[osimage.SHA256]int64{sha('d'): 100, sha('z'): 100}
	served, _ = FleetNeeds(fleetMgmtValues, needs, mgmt, stored, FleetPolicy{Storage: 1000})
	if _, ok := served[sha('d')]; !ok {
		t.Error("a need stored already gave its room to a new one")
	}
	if n := len(needsOf(served)); n != 2 {
		t.Errorf("%d needs served in the 200 bytes left", n)
	}
}

// A record that declares no size counts as --max-image-size in the
// namespace's byte quota, not as 0 (issue 23, item 12).
func TestFleetNeedsChargeASizelessRecordTheMaxImageSize(t *testing.T) {
	uri := "oci://registry.example.org/sylva/x:1"
	needs := osimage.FleetNeeds{Images: []osimage.FleetNeed{
		{SHA256: sha('a'), Namespaces: []string{"wc1"}, Sources: []osimage.NeedSource{record("a", sha('a'), uri, "a.raw", "", "wc1")}},
		{SHA256: sha('b'), Namespaces: []string{"wc1"}, Sources: []osimage.NeedSource{record("b", sha('b'), uri, "b.raw", "", "wc1")}},
	}}
	served, refused := FleetNeeds(fleetMgmtValues, needs, nil, nil, FleetPolicy{MaxBytes: 100 << 30, MaxImageSize: 64 << 30})
	if n := len(needsOf(served)); n != 1 {
		t.Errorf("%d sizeless images served within 100Gi at 64Gi each", n)
	}
	if len(refused) != 1 || refused[0].Reason != osimage.RefusedBytes || !strings.Contains(refused[0].Message, "declares no size") {
		t.Errorf("refused: %+v", refused)
	}
}

// A size that parses but is absurd must not wrap the quota's sum around:
// 1 GiB used plus 2^63-1 declared is over any quota, and so is everything
// the namespace asks after it.
func TestFleetNeedsQuotaSurvivesAnOverflowingSize(t *testing.T) {
	uri := "oci://registry.example.org/sylva/x:1"
	needs := osimage.FleetNeeds{Images: []osimage.FleetNeed{
		{SHA256: sha('a'), Namespaces: []string{"wc1"}, Sources: []osimage.NeedSource{record("a", sha('a'), uri, "a.raw", "1073741824", "wc1")}},
		{SHA256: sha('b'), Namespaces: []string{"wc1"}, Sources: []osimage.NeedSource{record("b", sha('b'), uri, "b.raw", "9223372036854775807", "wc1")}},
		{SHA256: sha('c'), Namespaces: []string{"wc1"}, Sources: []osimage.NeedSource{record("c", sha('c'), uri, "c.raw", "200000000000", "wc1")}},
	}}
	served, refused := FleetNeeds(fleetMgmtValues, needs, nil, nil, FleetPolicy{MaxBytes: 100 << 30})
	got := needsOf(served)
	if len(got) != 1 {
		t.Errorf("served %v within a 100Gi quota, want only the 1Gi image", got)
	}
	if len(refused) != 2 || refused[0].Reason != osimage.RefusedBytes || refused[1].Reason != osimage.RefusedBytes {
		t.Errorf("refused: %+v, want the huge and the 200 GB image refused for the byte quota", refused)
	}
}
