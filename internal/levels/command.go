package levels

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/sylva-projects/osimages/internal/exitcode"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/selector"
	"github.com/sylva-projects/osimages/internal/values"
)

// SelectOptions are those of `osimages select`, as its flags give them:
// a catalog, and either selector terms (KEY=PATTERN) or a level of
// cluster values.
type SelectOptions struct {
	OSImages      string
	Selectors     []string
	ClusterValues []string
	Level         string
}

// RunSelect lists on stdout the images of the catalog that the choice of o
// matches, then picks one as render would. A pick that fails is an
// exitcode.FailureError, bad input an exitcode.InputError.
func RunSelect(o SelectOptions, stdout io.Writer) error {
	if o.OSImages == "" && len(o.ClusterValues) == 0 {
		return exitcode.InputError(errors.New("--os-images is required, unless --cluster-values holds the catalog (os_images)"))
	}
	var cat osimage.Catalog
	if o.OSImages != "" {
		var err error
		if cat, err = readCatalogFile(o.OSImages); err != nil {
			return exitcode.InputError(err)
		}
	}
	choice, context, vals, err := selectChoice(o)
	if err != nil {
		return exitcode.InputError(err)
	}
	if vals != nil {
		if cat, err = osimage.MergeA(cat, vals); err != nil {
			return exitcode.InputError(err)
		}
	}
	if !choice.IsSet() {
		return exitcode.FailureError(fmt.Errorf("%s: designates no image by .image_key or .os_image_selector (a null, false or {} os_image_selector is not set): it gives its image by hand, or none", context))
	}

	var matches []string
	if choice.Selector != nil {
		// A selector that cannot be tested against the catalog fails
		// the pick below, with the reason.
		matches, _ = choice.Selector.Select(cat)
	} else if _, ok := cat[choice.ImageKey]; ok {
		matches = []string{choice.ImageKey}
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "IMAGE KEY\tSHA256")
	for _, k := range matches {
		fmt.Fprintf(tw, "%s\t%s\n", k, cat[k].Get(osimage.FieldSHA256))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	picked, err := selector.Resolve(cat, choice.ImageKey, choice.Selector, context)
	if err != nil {
		return exitcode.FailureError(err)
	}
	fmt.Fprintf(stdout, "picked: %s\n", picked)
	return nil
}

// selectChoice builds the image_key/selector pair to try, from --selector
// terms or from a level of cluster values, which it returns too.
func selectChoice(o SelectOptions) (Choice, string, values.Values, error) {
	if len(o.ClusterValues) > 0 {
		if len(o.Selectors) > 0 {
			return Choice{}, "", nil, errors.New("--selector and --cluster-values exclude each other: a level's selector is taken whole")
		}
		if o.Level == "" {
			return Choice{}, "", nil, errors.New("--cluster-values needs --level, such as .control_plane.capm3 or .machine_deployments.md0.capm3")
		}
		v, err := values.LoadFiles(o.ClusterValues...)
		if err != nil {
			return Choice{}, "", nil, err
		}
		c, err := ChoiceAt(v, o.Level)
		return c, o.Level, v, err
	}
	if o.Level != "" {
		return Choice{}, "", nil, errors.New("--level needs --cluster-values")
	}
	if len(o.Selectors) == 0 {
		return Choice{}, "", nil, errors.New("give the selector with --selector KEY=PATTERN, or a level with --cluster-values and --level")
	}
	raw := map[string]any{}
	for _, term := range o.Selectors {
		k, v, ok := strings.Cut(term, "=")
		if !ok || k == "" {
			return Choice{}, "", nil, fmt.Errorf("--selector %q: want KEY=PATTERN, such as os=ubuntu", term)
		}
		raw[k] = v
	}
	sel, err := selector.Parse(raw, "--selector")
	return Choice{Selector: &sel}, "--selector", nil, err
}

// readCatalogFile reads os_images from a values document or from an
// os-images-info ConfigMap manifest.
func readCatalogFile(path string) (osimage.Catalog, error) {
	doc, err := osimage.ReadValuesDocument(path)
	if err != nil {
		return nil, err
	}
	cat, err := osimage.ParseInfo(doc)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return cat, nil
}
