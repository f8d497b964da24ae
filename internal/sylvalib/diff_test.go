package sylvalib_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"

	"helm.sh/helm/v4/pkg/chart/v2/loader"

	"github.com/sylva-projects/osimages/internal/sylvalib"
	"github.com/sylva-projects/osimages/internal/testenv"
)

// Kind is what became of a case.
type Kind string

const (
	KindPick     Kind = "pick"     // one image key
	KindList     Kind = "list"     // the keys a list of selectors matches
	KindUnset    Kind = "unset"    // the level designates no image by image_key or selector
	KindNone     Kind = "none"     // no OS image could be found matching selectors
	KindSeveral  Kind = "several"  // we need one OS image, but N were found
	KindDiffer   Kind = "differ"   // image_key and os_image_selector pick different images
	KindNotFound Kind = "notfound" // nothing in os_images for image_key
	KindInvalid  Kind = "invalid"  // the input is refused
)

// Outcome is a pick, or a failure and its message.
type Outcome struct {
	Kind    Kind
	Key     string
	Keys    []string
	Message string
}

func (o Outcome) String() string {
	switch o.Kind {
	case KindPick:
		return "picks " + o.Key
	case KindList:
		return "lists [" + strings.Join(o.Keys, " ") + "]"
	case KindUnset:
		return "no image from image_key or os_image_selector"
	}
	msg := o.Message
	if i := strings.Index(msg, "\n"); i >= 0 {
		msg = msg[:i] + " …"
	}
	return fmt.Sprintf("fails (%s): %s", o.Kind, msg)
}

func (o Outcome) Equal(p Outcome) bool {
	return o.Kind == p.Kind && o.Key == p.Key && slices.Equal(o.Keys, p.Keys)
}

func picked(key string) Outcome    { return Outcome{Kind: KindPick, Key: key} }
func listed(keys []string) Outcome { return Outcome{Kind: KindList, Keys: append([]string{}, keys...)} }

// failed classifies a failure by the words of contract §9, which both
// sides use.
func failed(err error) Outcome {
	msg := err.Error()
	o := Outcome{Kind: KindInvalid, Message: msg}
	switch {
	case strings.Contains(msg, "we need one OS image, but"):
		o.Kind = KindSeveral
	case strings.Contains(msg, "no OS image could be found matching selectors"):
		o.Kind = KindNone
	case strings.Contains(msg, "but the resulting image key differ"):
		o.Kind = KindDiffer
	case strings.Contains(msg, "nothing in os_images for image_key"):
		o.Kind = KindNotFound
	}
	return o
}

// sylvaOutcome runs a case through the library.
func sylvaOutcome(lib *sylvalib.Library, c Case) Outcome {
	var failure *sylvalib.Failure
	outcome := func(err error) Outcome {
		if errors.As(err, &failure) {
			return failed(err)
		}
		return Outcome{Kind: "harness error", Message: err.Error()}
	}
	switch c.Mode {
	case ModePick, ModeList:
		images, err := decode(c.OSImages)
		if err != nil {
			return outcome(err)
		}
		var sels []any
		for _, s := range c.Selectors {
			sel, err := decode(s)
			if err != nil {
				return outcome(err)
			}
			sels = append(sels, sel)
		}
		if c.Mode == ModePick {
			key, err := lib.PickOSImage(images, sels, "--selector")
			if err != nil {
				return outcome(err)
			}
			return picked(key)
		}
		keys, err := lib.SelectOSImages(images, sels)
		if err != nil {
			return outcome(err)
		}
		return listed(keys)
	default:
		m, err := helmValues(c)
		if err != nil {
			return outcome(err)
		}
		key, err := lib.LevelImageKey(m, c.MD, c.Level())
		if err != nil {
			return outcome(err)
		}
		if key == "" {
			return Outcome{Kind: KindUnset}
		}
		return picked(key)
	}
}

// helmValues merges the values files of a case as `helm -f a -f b` does.
func helmValues(c Case) (map[string]any, error) {
	merged := map[string]any{}
	for _, doc := range append([]string{c.Cluster}, c.Overrides...) {
		v, err := decode(doc)
		if err != nil {
			return nil, err
		}
		m, _ := v.(map[string]any)
		merged = loader.MergeMaps(merged, m)
	}
	return merged, nil
}

// randomSeed and randomCount fix the random cases: the same every run, so
// that a failure can be replayed.
const (
	randomSeed  = 20260713
	randomCount = 150
)

// TestSylvaLibraryDifferential runs every case through the real
// sylva-library and through osimages, and passes when each difference is
// one of the documented ones (differences, also in docs/selection.md).
func TestSylvaLibraryDifferential(t *testing.T) {
	tgz := filepath.Join(testenv.SharedDir(t), "sylva", "sylva-library-0.9.0.tgz")
	if _, err := os.Stat(tgz); err != nil {
		testenv.Missing(t, "the real Sylva library is not there (%v): skipping the differential test against it", err)
	}
	cases := append(handCases(), randomCases(randomSeed, randomCount)...)

	// The library chart is shared by the renders of one goroutine only:
	// rendering sets it as the dependency of each throwaway chart.
	type result struct{ sylva, osimages Outcome }
	results := make([]result, len(cases))
	var wg sync.WaitGroup
	next := make(chan int)
	workers := min(runtime.GOMAXPROCS(0), 4)
	var loadErr error
	var once sync.Once
	for range workers {
		wg.Go(func() {
			lib, err := sylvalib.Load(tgz)
			if err != nil {
				once.Do(func() { loadErr = err })
			}
			for i := range next {
				if lib == nil {
					continue
				}
				results[i] = result{sylvaOutcome(lib, cases[i]), osimagesOutcome(cases[i])}
			}
		})
	}
	for i := range cases {
		next <- i
	}
	close(next)
	wg.Wait()
	if loadErr != nil {
		t.Fatal(loadErr)
	}

	hits := map[string]int{}
	kinds := map[string]int{}
	agree, documented := 0, 0
	for i, c := range cases {
		s, o := results[i].sylva, results[i].osimages
		if s.Kind == "harness error" {
			t.Errorf("%s\n  cannot run the library: %s", c, s.Message)
			continue
		}
		kinds[string(c.Mode)+"/"+string(s.Kind)]++
		if s.Equal(o) {
			agree++
			continue
		}
		var why []string
		for _, d := range differences {
			if d.Explains(c, s, o) {
				why = append(why, d.ID)
			}
		}
		if len(why) == 0 {
			t.Errorf("undocumented difference: %s\n  sylva-library: %s\n  osimages:      %s", c, s, o)
			continue
		}
		documented++
		hits[why[0]]++
	}
	t.Logf("%d cases compared with sylva-library %s: %d agree, %d documented differences %v, %d undocumented",
		len(cases), "0.9.0", agree, documented, hits, len(cases)-agree-documented)
	t.Logf("what the library did, by mode: %v", kinds)
	for _, d := range differences {
		if hits[d.ID] == 0 && !t.Failed() {
			t.Errorf("documented difference %q is never seen: add a case that shows it, or drop it from the table", d.ID)
		}
	}
}
