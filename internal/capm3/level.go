package capm3

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"net/url"
	"slices"
	"strings"

	"github.com/sylva-projects/osimages/internal/levels"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/selector"
	"github.com/sylva-projects/osimages/internal/values"
)

// DefaultScheme is used when a level sets no image_provisioning_scheme.
// It is the scheme of the contract's example. The checksum protects the
// image's content whatever the scheme, so https only adds confidentiality
// by default; a server without TLS needs an explicit http.
const DefaultScheme = "https"

// diskFormats are the formats the Metal3MachineTemplate CRD accepts.
var diskFormats = map[string]bool{"raw": true, "qcow2": true, "vdi": true, "vmdk": true, "live-iso": true}

// checksumTypes are the checksum algorithms CAPM3 accepts, with the hex
// length of their digests.
var checksumTypes = map[string]int{"md5": 32, "sha256": 64, "sha512": 128}

type renderer struct {
	// values are the cluster's, whose own os_images tell where an image
	// record of catalog came from, with catalogFrom.
	values      values.Values
	catalogFrom string
	cluster     cluster
	catalog     osimage.Catalog
	served      osimage.ServedSet
	servedOCI   osimage.ServedOCI
	apiVersion  string
	ociRefused  error
}

// spec returns the spec of the template of one level, and the key in (A)
// of the image it picked (empty when the image is given by hand).
func (r *renderer) spec(lv levels.Level) (map[string]any, string, error) {
	var errs []error
	fail := func(err error) { errs = append(errs, err) }

	image, key, err := r.image(lv)
	if err != nil {
		fail(err)
	}
	tspec := map[string]any{}
	spec := map[string]any{"template": map[string]any{"spec": tspec}}
	if image != nil {
		tspec["image"] = image
	}

	if raw, ok := lv.Values["hostSelector"]; ok && raw != nil {
		if hs, err := hostSelector(raw, lv.Path+".hostSelector"); err != nil {
			fail(err)
		} else {
			tspec["hostSelector"] = hs
		}
	}
	if raw, ok := lv.Values["dataTemplate"]; ok && raw != nil {
		if dt, err := r.dataTemplate(raw, lv.Path+".dataTemplate"); err != nil {
			fail(err)
		} else {
			tspec["dataTemplate"] = dt
		}
	}
	if mode, err := values.String(lv.Values, "automatedCleaningMode", lv.Path+".automatedCleaningMode"); err != nil {
		fail(err)
	} else if mode != "" {
		if mode != "metadata" && mode != "disabled" {
			fail(fmt.Errorf("%s.automatedCleaningMode: must be metadata or disabled, got %q", lv.Path, mode))
		} else {
			tspec["automatedCleaningMode"] = mode
		}
	}
	if raw, ok := lv.Values["nodeReuse"]; ok && raw != nil {
		// nodeReuse belongs to the template itself, not to the
		// Metal3Machines it stamps out.
		if b, err := values.Bool(lv.Values, "nodeReuse", lv.Path+".nodeReuse", false); err != nil {
			fail(err)
		} else {
			spec["nodeReuse"] = b
		}
	}
	if len(errs) > 0 {
		return nil, "", errors.Join(errs...)
	}
	return spec, key, nil
}

// image returns the image block of a level, from (A) or given by hand.
func (r *renderer) image(lv levels.Level) (map[string]any, string, error) {
	v, path := lv.Values, lv.Path
	choice, err := lv.Choice(r.cluster.finalize, r.cluster.finalizeErr)
	if err != nil {
		return nil, "", err
	}
	manual := map[string]string{}
	for _, f := range []string{"machine_image_url", "machine_image_checksum", "machine_image_checksum_type", "machine_image_format"} {
		s, err := values.String(v, f, path+"."+f)
		if err != nil {
			return nil, "", err
		}
		if s != "" {
			manual[f] = s
		}
	}
	picks := choice.IsSet()
	switch {
	case picks && len(manual) > 0:
		return nil, "", fmt.Errorf("%s: %s given by hand, and .image_key or .os_image_selector set too: set only one way (a null, false or {} in a more specific level unsets what a more general one set)", path, strings.Join(slices.Sorted(maps.Keys(manual)), ", "))
	case len(manual) > 0:
		img, err := r.manualImage(manual, path)
		return img, "", err
	case !picks:
		return nil, "", pickFailed(fmt.Errorf("%s: no image: set .os_image_selector, .image_key, or .machine_image_url", path))
	}

	key, err := selector.Resolve(r.catalog, choice.ImageKey, choice.Selector, path)
	if err != nil {
		return nil, "", pickFailed(err)
	}
	img, err := r.servedImage(key, v, path)
	return img, key, err
}

// servedImage is the image block of image key of (A), served by the
// management cluster at a path that derives from the image alone.
func (r *renderer) servedImage(key string, v values.Values, path string) (map[string]any, error) {
	var errs []error
	img := r.catalog[key]
	// The identity rules are the image server's (osimage.Image.ServedAt):
	// render never writes a URL that the server would not answer.
	sha, filename, err := img.ServedAt(path + ": os_images." + key)
	if err != nil {
		errs = append(errs, fmt.Errorf("%w\n%s: os_images.%s comes from %s: correct the image's record there (its sha256 is the image file's, 64 lowercase hexadecimal digits as sha256sum prints them; its filename follows the rules of docs/selection.md, One image identity)", err, path, key, r.origin(key)))
	}
	format, err := img.StringField(osimage.FieldImageFormat)
	switch {
	case err != nil:
		errs = append(errs, fmt.Errorf("%s: os_images.%s: %w", path, key, err))
	case format == "":
		errs = append(errs, fmt.Errorf("%s: os_images.%s has no image-format, so it cannot be served for capm3", path, key))
	case !diskFormats[format]:
		errs = append(errs, fmt.Errorf("%s: os_images.%s: image-format %q is not one Metal3 accepts (%s)", path, key, format, strings.Join(slices.Sorted(maps.Keys(diskFormats)), ", ")))
	}
	delivery, err := levels.Delivery(v, path)
	if err != nil {
		errs = append(errs, err)
	}
	if delivery == levels.DeliveryOCI && format != "" && diskFormats[format] && !slices.Contains(osimage.OCIDiskTypes, format) {
		// Ironic learns an oci:// image's format from the tag's index,
		// and skips a manifest of any other disk type.
		errs = append(errs, fmt.Errorf("%s: os_images.%s: image-format %q cannot be delivered by oci://: Ironic reads the disk format of an oci:// image from its tag, and knows %s only; set .image_delivery: http", path, key, format, strings.Join(osimage.OCIDiskTypes, " and ")))
	}
	if delivery == levels.DeliveryOCI && r.ociRefused != nil {
		errs = append(errs, pickFailed(fmt.Errorf("%s.image_delivery: oci: %w", path, r.ociRefused)))
	}
	host, base, err := provisioningBase(v, path)
	if err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	// The served check comes last: it is the one error an operator may
	// just wait out, and the others need a fix whatever it says.
	if err := r.checkServed(sha, key, path); err != nil {
		return nil, err
	}
	if delivery == levels.DeliveryOCI {
		// The tag is the disk type: Ironic reads it from the tag's index
		// (a URL pinned to a manifest digest is of unknown format to it,
		// and its agent then copies the whole image into its RAM); the
		// repository is the sha256, so the URL names one image.
		ref := osimage.OCIReference{Host: host, SHA256: sha, DiskType: format}
		if err := r.checkServedOCI(ref, key, path); err != nil {
			return nil, err
		}
		// Metal3 verifies an oci:// image by its manifest's layer digest,
		// the image's sha256: no checksum fields.
		return map[string]any{
			"url":           ref.String(),
			r.formatField(): format,
		}, nil
	}
	return map[string]any{
		"url":           base + osimage.ImagePath(sha, filename),
		"checksum":      string(sha),
		"checksumType":  "sha256",
		r.formatField(): format,
	}, nil
}

// checkServed enforces contract §8: (B) only ever makes rendering fail.
func (r *renderer) checkServed(sha osimage.SHA256, key, path string) error {
	if err := r.served.Require(sha, key); err != nil {
		return pickFailed(fmt.Errorf("%s: %w", path, err))
	}
	return nil
}

// checkServedOCI holds an oci:// URL to what the server publishes, when
// render knows it: an image it publishes no oci:// reference for is served
// by a server without the OCI face (Sylva's), which would answer 404.
// What the tag answers is built from the verified image alone, so no
// catalog field has to agree.
func (r *renderer) checkServedOCI(ref osimage.OCIReference, key, path string) error {
	if r.servedOCI == nil {
		return nil
	}
	if _, ok := r.servedOCI[ref.SHA256]; !ok {
		return pickFailed(fmt.Errorf("%s: image %s/%s is served, but the management cluster's image server publishes no oci:// reference for it (served-oci.yaml): set .image_delivery: http, or wait until it publishes one", path, ref.SHA256, key))
	}
	return nil
}

// origin names where the record of image key of (A) comes from, for an
// operator to correct it there: the values' own os_images, the ConfigMap
// they are merged over, or both, field by field.
func (r *renderer) origin(key string) string {
	own := false
	if inline, ok := r.values["os_images"].(map[string]any); ok {
		_, own = inline[key]
	}
	switch {
	case own && r.catalogFrom != "":
		return "the values' os_images merged over " + r.catalogFrom
	case own || r.catalogFrom == "":
		return "the values' os_images"
	default:
		return r.catalogFrom
	}
}

// provisioningBase returns the host (with its port, an IPv6 address in
// brackets) and scheme://host of the management cluster's image server.
func provisioningBase(v values.Values, path string) (string, string, error) {
	host, err := values.String(v, "image_provisioning_host", path+".image_provisioning_host")
	if err != nil {
		return "", "", err
	}
	if host == "" {
		return "", "", fmt.Errorf("%s.image_provisioning_host: must be set to the address where the management cluster serves images", path)
	}
	if strings.ContainsAny(host, "/?#@ ") {
		return "", "", fmt.Errorf("%s.image_provisioning_host: %q must be a host name or address, with an optional port", path, host)
	}
	// A bare IPv6 address needs brackets in a URL, or its colons read as a
	// port.
	if ip := net.ParseIP(host); ip != nil && ip.To4() == nil {
		host = "[" + host + "]"
	}
	scheme, err := values.String(v, "image_provisioning_scheme", path+".image_provisioning_scheme")
	if err != nil {
		return "", "", err
	}
	if scheme == "" {
		scheme = DefaultScheme
	}
	if scheme != "http" && scheme != "https" {
		return "", "", fmt.Errorf("%s.image_provisioning_scheme: must be http or https, got %q", path, scheme)
	}
	return host, scheme + "://" + host, nil
}

// manualImage is the image block of a level that gives its image by hand.
// It is not checked against (B): the image does not come from the
// management cluster's server.
func (r *renderer) manualImage(m map[string]string, path string) (map[string]any, error) {
	var errs []error
	u := m["machine_image_url"]
	checksum := m["machine_image_checksum"]
	ctype := m["machine_image_checksum_type"]
	format := m["machine_image_format"]
	if u == "" {
		errs = append(errs, fmt.Errorf("%s.machine_image_url: must be set when the image is given by hand", path))
	}
	if parsed, err := url.Parse(u); u != "" && (err != nil || parsed.Scheme == "" || parsed.Host == "") {
		errs = append(errs, fmt.Errorf("%s.machine_image_url: %q is not an absolute URL", path, u))
	}
	oci := strings.HasPrefix(u, "oci://")
	switch {
	case oci && (checksum != "" || ctype != ""):
		errs = append(errs, fmt.Errorf("%s.machine_image_checksum: must not be set for an oci:// image, which Metal3 verifies by its digest", path))
	case !oci && u != "" && checksum == "" && format != "live-iso":
		errs = append(errs, fmt.Errorf("%s.machine_image_checksum: must be set for %s", path, u))
	}
	if ctype != "" {
		if _, ok := checksumTypes[ctype]; !ok {
			errs = append(errs, fmt.Errorf("%s.machine_image_checksum_type: must be md5, sha256 or sha512, got %q", path, ctype))
		}
	}
	if checksum != "" && isHex(checksum) {
		// An inline digest tells its own algorithm; CAPM3 has no "auto",
		// so an omitted type is filled in rather than guessed by Ironic.
		want := ""
		for t, n := range checksumTypes {
			if n == len(checksum) {
				want = t
			}
		}
		switch {
		case want == "":
			errs = append(errs, fmt.Errorf("%s.machine_image_checksum: %d hex digits is no md5, sha256 or sha512 digest", path, len(checksum)))
		case ctype == "":
			ctype = want
		case checksumTypes[ctype] != 0 && ctype != want:
			errs = append(errs, fmt.Errorf("%s.machine_image_checksum_type: is %s, but the checksum is a %s digest", path, ctype, want))
		}
	} else if checksum != "" && ctype == "" {
		errs = append(errs, fmt.Errorf("%s.machine_image_checksum_type: must be set when the checksum is a URL", path))
	}
	if format != "" && !diskFormats[format] {
		errs = append(errs, fmt.Errorf("%s.machine_image_format: must be one of %s, got %q", path, strings.Join(slices.Sorted(maps.Keys(diskFormats)), ", "), format))
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	img := map[string]any{"url": u}
	if checksum != "" {
		img["checksum"] = checksum
		img["checksumType"] = ctype
	}
	if format != "" {
		img[r.formatField()] = format
	}
	return img, nil
}

func (r *renderer) formatField() string {
	if r.apiVersion == V1Beta2 {
		return "diskFormat"
	}
	return "format"
}

// hostSelector checks the shape of a hostSelector. Unknown fields would be
// pruned by the API server after they changed the template's hash, so a
// typo would roll machines for nothing; they are refused instead.
func hostSelector(raw any, path string) (map[string]any, error) {
	m, ok := raw.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("%s: must be a map with matchLabels and/or matchExpressions", path)
	}
	for _, k := range slices.Sorted(maps.Keys(m)) {
		v := m[k]
		switch k {
		case "matchLabels":
			labels, ok := v.(map[string]any)
			if !ok && v != nil {
				return nil, fmt.Errorf("%s.matchLabels: must be a map of label to value", path)
			}
			for _, l := range slices.Sorted(maps.Keys(labels)) {
				if _, ok := labels[l].(string); !ok {
					return nil, fmt.Errorf("%s.matchLabels.%s: must be a string (quote it), got %v", path, l, labels[l])
				}
			}
		case "matchExpressions":
			if _, ok := v.([]any); !ok && v != nil {
				return nil, fmt.Errorf("%s.matchExpressions: must be a list", path)
			}
		default:
			return nil, fmt.Errorf("%s: unknown field %q (Metal3 knows matchLabels and matchExpressions)", path, k)
		}
	}
	// A copy: the rendered objects share no map with the values.
	return values.DeepCopy(m).(map[string]any), nil
}

// dataTemplateFields are the fields of a dataTemplate reference in each
// API version: v1beta2 narrowed the ObjectReference to name and namespace.
var dataTemplateFields = map[string]map[string]bool{
	V1Beta1: {"apiVersion": true, "fieldPath": true, "kind": true, "name": true, "namespace": true, "resourceVersion": true, "uid": true},
	V1Beta2: {"name": true, "namespace": true},
}

func (r *renderer) dataTemplate(raw any, path string) (map[string]any, error) {
	m, ok := raw.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("%s: must be a map (a reference to a Metal3DataTemplate, such as {name: my-template})", path)
	}
	allowed := dataTemplateFields[r.apiVersion]
	for _, k := range slices.Sorted(maps.Keys(m)) {
		v := m[k]
		if !allowed[k] {
			return nil, fmt.Errorf("%s: field %q is not part of a dataTemplate reference in %s (allowed: %s)", path, k, r.apiVersion, strings.Join(slices.Sorted(maps.Keys(allowed)), ", "))
		}
		if _, ok := v.(string); !ok {
			return nil, fmt.Errorf("%s.%s: must be a string", path, k)
		}
	}
	// A copy: the rendered objects share no map with the values.
	return values.DeepCopy(m).(map[string]any), nil
}

func isHex(s string) bool {
	for _, c := range s {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
			return false
		}
	}
	return s != ""
}
