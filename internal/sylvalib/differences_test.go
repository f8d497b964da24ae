package sylvalib_test

import (
	"os"
	"path/filepath"
	"regexp"
	"regexp/syntax"
	"strconv"
	"strings"
	"testing"
)

// Difference is a documented way in which osimages does not do what the
// real sylva-library does. The "Differences from Sylva" table of
// docs/selection.md lists the same, by ID, with the reasons.
type Difference struct {
	ID string
	// Explains says whether the difference accounts for what the two sides
	// did with the case. It checks the cause in the input too, not only the
	// messages, so that an unrelated difference cannot hide behind it.
	Explains func(c Case, sylva, osimages Outcome) bool
}

// differences is the whole table. Every entry must be seen by some case,
// and every difference seen must be in it.
var differences = []Difference{
	{
		// "a)|(b" is checked on its own: Sylva builds ^(a)|(b)$, which
		// matches any value starting with a or ending with b.
		ID: "pattern escaping its anchors",
		Explains: func(_ Case, _, o Outcome) bool {
			p, ok := refusedPattern(o)
			return ok && !compiles(p) && compilesAnchored(p)
		},
	},
	{
		// Sylva's regexMatch takes an invalid expression as "no match".
		ID: "invalid regular expression",
		Explains: func(_ Case, _, o Outcome) bool {
			p, ok := refusedPattern(o)
			return ok && !compilesAnchored(p)
		},
	},
	{
		// Sylva allows extra keys whenever _use_extra_keys_ is present,
		// whatever its value, and takes any string or boolean there.
		ID: "_use_extra_keys_ other than true",
		Explains: func(c Case, s, o Outcome) bool {
			return o.Kind == KindInvalid && strings.Contains(o.Message, "_use_extra_keys_") &&
				!strings.Contains(s.Message, "not among the supported base keys") &&
				strings.Contains(strings.Join(append(c.Selectors, c.Cluster), " "), "_use_extra_keys_")
		},
	},
	{
		// Sylva's finalize-os-image-selector computes every default, even
		// the ones the selector overrides.
		ID: "finalizing needs only what it adds",
		Explains: func(c Case, s, o Outcome) bool {
			if o.Kind == KindInvalid || s.Kind != KindInvalid || c.Mode != ModeLevel {
				return false
			}
			v, err := decode(c.Cluster)
			if err != nil {
				return false
			}
			m, _ := v.(map[string]any)
			if strings.Contains(s.Message, "k8s-flavor-from-cabpX: unknown k8s-flavor") {
				return true
			}
			_, isString := m["k8s_version"].(string)
			return !isString && strings.Contains(s.Message, "expected string")
		},
	},
	{
		// Sylva prints whatever image_key holds (123, true) and uses that
		// as the key; osimages reads values as written and refuses it.
		ID: "image_key that is not a string",
		Explains: func(_ Case, _, o Outcome) bool {
			// osimages says so only of an image_key that is no string.
			return o.Kind == KindInvalid && strings.Contains(o.Message, ".image_key: must be the key of an image in os_images, got ")
		},
	},
	{
		// Sylva's compute-image-key returns an image_key without looking
		// it up; the chart then fails on an image with no fields.
		ID: "image_key alone that is not in os_images",
		Explains: func(c Case, s, o Outcome) bool {
			if s.Kind != KindPick || o.Kind != KindNotFound || !strings.Contains(o.Message, "image_key "+s.Key) {
				return false
			}
			v, err := decode(c.Cluster)
			if err != nil {
				return false
			}
			images, _ := v.(map[string]any)["os_images"].(map[string]any)
			_, ok := images[s.Key]
			return !ok
		},
	},
}

func init() {
	// Defined here, as it runs osimages again.
	differences = append(differences, Difference{
		// osimages merges values files as Helm coalesces them with chart
		// defaults, for every key: a null removes what an earlier file
		// set. Sylva's chart keeps a null that has no default.
		ID: "a null in a later values file",
		Explains: func(c Case, s, _ Outcome) bool {
			if c.Mode != ModeLevel || len(c.Overrides) == 0 {
				return false
			}
			helm, err := helmValues(c)
			return err == nil && osimagesLevel(c, helm).Equal(s)
		},
	})
}

var refusedRE = regexp.MustCompile(`invalid regular expression ("(?:[^"\\]|\\.)*")`)

// refusedPattern is the pattern osimages refused as no regular expression.
func refusedPattern(o Outcome) (string, bool) {
	if o.Kind != KindInvalid {
		return "", false
	}
	m := refusedRE.FindStringSubmatch(o.Message)
	if m == nil {
		return "", false
	}
	p, err := strconv.Unquote(m[1])
	return p, err == nil
}

func compiles(p string) bool {
	_, err := syntax.Parse(p, syntax.Perl)
	return err == nil
}

func compilesAnchored(p string) bool {
	_, err := regexp.Compile("^(" + p + ")$")
	return err == nil
}

// differencesDoc is where the table of differences is documented.
const differencesDoc = "docs/selection.md"

// TestDifferencesDocumented checks that the documented table (differencesDoc,
// "Differences from Sylva") lists every difference, and no other.
func TestDifferencesDocumented(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "..", filepath.FromSlash(differencesDoc)))
	if err != nil {
		t.Fatal(err)
	}
	heading := regexp.MustCompile(`(?m)^#+ Differences from Sylva\n`).FindIndex(data)
	if heading == nil {
		t.Fatalf(`%s has no "Differences from Sylva" section`, differencesDoc)
	}
	section := string(data[heading[1]:])
	if end := strings.Index(section, "\n#"); end >= 0 {
		section = section[:end]
	}
	rows := map[string]bool{}
	for _, line := range strings.Split(section, "\n") {
		if !strings.HasPrefix(line, "| ") || strings.HasPrefix(line, "| difference") || strings.HasPrefix(line, "|---") {
			continue
		}
		id := strings.TrimSpace(strings.Split(line, "|")[1])
		rows[strings.Trim(id, "*")] = true
	}
	if len(rows) == 0 {
		t.Fatalf("the differences table of %s has no rows", differencesDoc)
	}
	for _, d := range differences {
		if !rows[d.ID] {
			t.Errorf("the differences table of %s lacks %q", differencesDoc, d.ID)
		}
		delete(rows, d.ID)
	}
	for id := range rows {
		t.Errorf("the differences table of %s lists %q, which the differential test does not know", differencesDoc, id)
	}
}
