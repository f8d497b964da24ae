package osimage

import (
	"errors"
	"strings"
	"testing"
)

// A need whose sha256 is malformed is dropped alone, named, and the
// others are read: one tenant's bad entry never costs the others their
// needs (issue 23, item 4).
func TestParseFleetNeedsDropsAMalformedNeedAlone(t *testing.T) {
	good := strings.Repeat("a", 64)
	doc := "images:\n- sha256: " + strings.ToUpper(good) + "\n  namespaces: [evil]\n- sha256: " + good + "\n  namespaces: [wc1]\n"
	f, dropped, err := ParseFleetNeeds(doc)
	if err != nil {
		t.Fatalf("the whole document is refused for one need: %v", err)
	}
	if len(f.Images) != 1 || f.Images[0].SHA256 != SHA256(good) {
		t.Errorf("needs kept: %+v", f.Images)
	}
	if len(dropped) != 1 || !strings.Contains(dropped[0].Error(), "evil") || !strings.Contains(dropped[0].Error(), "lowercase") {
		t.Errorf("dropped: %v", dropped)
	}
}

func TestFleetNeedsTooLarge(t *testing.T) {
	var f FleetNeeds
	for i := range 3000 {
		sha := strings.Repeat("0", 60) + strings.Repeat("f", 4)
		sha = sha[:60] + string(rune('a'+i%6)) + sha[61:]
		f.Images = append(f.Images, FleetNeed{SHA256: SHA256(sha), Namespaces: []string{strings.Repeat("n", 300)}})
	}
	_, err := f.Data("ConfigMap sylva-system/osimages-fleet-needs")
	var size *SizeError
	if !errors.As(err, &size) || !strings.Contains(err.Error(), "osimages-fleet-needs") {
		t.Fatalf("want a size error naming the ConfigMap, got %v", err)
	}
}
