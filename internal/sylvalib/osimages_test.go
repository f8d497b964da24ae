package sylvalib_test

import (
	"strings"

	"github.com/sylva-projects/osimages/internal/levels"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/selector"
	"github.com/sylva-projects/osimages/internal/values"
)

// osimagesOutcome runs a case through osimages, by the code paths of
// `osimages select` (and of render and the image server, which share
// them).
func osimagesOutcome(c Case) Outcome {
	switch c.Mode {
	case ModePick:
		cat, err := osimage.ParseInfo([]byte("os_images:\n" + indent(c.OSImages)))
		if err != nil {
			return failed(err)
		}
		raw, err := decode(c.Selectors[0])
		if err != nil {
			return failed(err)
		}
		sel, err := selector.Parse(raw, "--selector")
		if err != nil {
			return failed(err)
		}
		key, err := selector.Pick(sel, cat, "--selector")
		if err != nil {
			return failed(err)
		}
		return picked(key)
	case ModeList:
		cat, err := osimage.ParseInfo([]byte("os_images:\n" + indent(c.OSImages)))
		if err != nil {
			return failed(err)
		}
		var l selector.List
		for _, s := range c.Selectors {
			raw, err := decode(s)
			if err != nil {
				return failed(err)
			}
			sel, err := selector.Parse(raw, "selector")
			if err != nil {
				return failed(err)
			}
			l = append(l, sel)
		}
		keys, err := l.Select(cat)
		if err != nil {
			return failed(err)
		}
		return listed(keys)
	default:
		// As values.LoadFiles merges -f files.
		v, err := values.Parse([]byte(c.Cluster))
		if err != nil {
			return failed(err)
		}
		v = values.Merge(values.Values{}, v)
		for _, o := range c.Overrides {
			ov, err := values.Parse([]byte(o))
			if err != nil {
				return failed(err)
			}
			v = values.Merge(v, ov)
		}
		return osimagesLevel(c, v)
	}
}

// osimagesLevel picks the image of a level of merged cluster values.
func osimagesLevel(c Case, v values.Values) Outcome {
	cat, err := osimage.MergeA(nil, v)
	if err != nil {
		return failed(err)
	}
	choice, err := levels.ChoiceAt(v, c.Level())
	if err != nil {
		return failed(err)
	}
	if !choice.IsSet() {
		return Outcome{Kind: KindUnset}
	}
	key, err := selector.Resolve(cat, choice.ImageKey, choice.Selector, c.Level())
	if err != nil {
		return failed(err)
	}
	return picked(key)
}

func indent(doc string) string {
	return "  " + strings.ReplaceAll(doc, "\n", "\n  ")
}
