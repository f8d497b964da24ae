package main

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/sylva-projects/osimages/internal/exitcode"
	"github.com/sylva-projects/osimages/internal/levels"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/selector"
	"github.com/sylva-projects/osimages/internal/values"
)

// selectOptions are the flags of `osimages select`: a catalog, and either
// selector terms (KEY=PATTERN) or a level of cluster values.
type selectOptions struct {
	osImages      string
	selectors     []string
	clusterValues []string
	level         string
}

func newSelectCommand() *cobra.Command {
	o := selectOptions{}
	cmd := &cobra.Command{
		Use:   "select (--os-images FILE --selector KEY=PATTERN ... | [--os-images FILE] --cluster-values FILE --level PATH)",
		Short: "List the images an OS image selector matches, to debug selectors",
		Long: `select lists the keys and sha256 of the images of an os_images catalog that a
selector matches, then says whether picking one image would succeed.

The catalog is a values document holding os_images, or an os-images-info
ConfigMap. The selector is given key by key with --selector (not finalized),
or taken from a level of cluster values with --cluster-values and --level
(such as .control_plane.capm3 or .machine_deployments.md0.capm3), merged and
finalized exactly as render does. With --cluster-values, the catalog is (A)
as render sees it: the os_images of --os-images (the cluster's
os-images-info), with the values' own os_images merged on top.

Exit codes: 0 exactly one image is picked, 1 the pick would fail (or the
level designates no image), 2 bad input.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runSelect(o, cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.osImages, "os-images", "", "os_images document or os-images-info ConfigMap (YAML)")
	f.StringArrayVar(&o.selectors, "selector", nil, "selector term KEY=PATTERN; repeat for several (all must match)")
	f.StringArrayVar(&o.clusterValues, "cluster-values", nil, "cluster values file; repeat to merge several, later wins")
	f.StringVar(&o.level, "level", "", "values path of the level whose selector to use, with --cluster-values")
	return cmd
}

// runSelect lists on stdout the images of the catalog that the choice of o
// matches, then picks one as render would. A pick that fails exits 1, bad
// input 2.
func runSelect(o selectOptions, stdout io.Writer) error {
	if o.osImages == "" && len(o.clusterValues) == 0 {
		return exitcode.InputError(errors.New("--os-images is required, unless --cluster-values holds the catalog (os_images)"))
	}
	var cat osimage.Catalog
	if o.osImages != "" {
		var err error
		if cat, err = readCatalogFile(o.osImages); err != nil {
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
func selectChoice(o selectOptions) (levels.Choice, string, values.Values, error) {
	if len(o.clusterValues) > 0 {
		if len(o.selectors) > 0 {
			return levels.Choice{}, "", nil, errors.New("--selector and --cluster-values exclude each other: a level's selector is taken whole")
		}
		if o.level == "" {
			return levels.Choice{}, "", nil, errors.New("--cluster-values needs --level, such as .control_plane.capm3 or .machine_deployments.md0.capm3")
		}
		v, err := values.LoadFiles(o.clusterValues...)
		if err != nil {
			return levels.Choice{}, "", nil, err
		}
		c, err := levels.ChoiceAt(v, o.level)
		return c, o.level, v, err
	}
	if o.level != "" {
		return levels.Choice{}, "", nil, errors.New("--level needs --cluster-values")
	}
	if len(o.selectors) == 0 {
		return levels.Choice{}, "", nil, errors.New("give the selector with --selector KEY=PATTERN, or a level with --cluster-values and --level")
	}
	raw := map[string]any{}
	for _, term := range o.selectors {
		k, v, ok := strings.Cut(term, "=")
		if !ok || k == "" {
			return levels.Choice{}, "", nil, fmt.Errorf("--selector %q: want KEY=PATTERN, such as os=ubuntu", term)
		}
		raw[k] = v
	}
	sel, err := selector.Parse(raw, "--selector")
	return levels.Choice{Selector: &sel}, "--selector", nil, err
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
