package selector

import (
	"fmt"
	"strings"

	"github.com/sylva-projects/osimages/internal/osimage"
)

// Pick returns the key of the one image of cat that sel matches. Zero or
// several matches are errors: a tie is never broken, because whatever rule
// broke it would let a new image in the catalog change a cluster's image
// silently. context (a values path such as .capm3) starts the error texts.
func Pick(sel Selector, cat osimage.Catalog, context string) (string, error) {
	keys, err := sel.Select(cat)
	if err != nil {
		return "", fmt.Errorf("%s: %w", context, err)
	}
	switch len(keys) {
	case 1:
		return keys[0], nil
	case 0:
		return "", fmt.Errorf("%s: no OS image could be found matching selectors (selector %s, %d images in os_images)", context, sel, len(cat))
	default:
		return "", fmt.Errorf("%s: we need one OS image, but %d were found matching selectors (selector %s matches %s)", context, len(keys), sel, strings.Join(keys, ", "))
	}
}

// Resolve returns the key of the image of cat that one level designates,
// by imageKey (empty when unset), by sel (nil when unset), or by both, in
// which case they must designate the same image. sel is used as given: the
// caller finalizes it first when it should be.
//
// The order is Sylva's compute-image-key: the selector picks first, then
// image_key must name the same image. An image_key alone must name an
// image of cat (Sylva passes it on unchecked, and the chart fails later on
// an image with no fields).
func Resolve(cat osimage.Catalog, imageKey string, sel *Selector, context string) (string, error) {
	if sel != nil {
		picked, err := Pick(*sel, cat, context)
		if err != nil {
			return "", err
		}
		if imageKey != "" && picked != imageKey {
			return "", fmt.Errorf("%s: both .os_image_selector and .image_key are set, but the resulting image key differ (image_key %s, os_image_selector %s picks %s)", context, imageKey, sel, picked)
		}
		return picked, nil
	}
	if imageKey == "" {
		return "", fmt.Errorf("%s: neither .image_key nor .os_image_selector is set", context)
	}
	// image_key is the selector {_os_images_key_: K}; since keys are
	// unique, matching it is a lookup, and a lookup also reads right when
	// K holds characters a regexp would treat specially.
	if _, ok := cat[imageKey]; !ok {
		return "", fmt.Errorf("%s: nothing in os_images for image_key %s", context, imageKey)
	}
	return imageKey, nil
}
