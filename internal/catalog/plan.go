// Package catalog turns a cluster's values into the os_images catalog that
// Sylva's os-images-info job publishes: it lists the candidate images (plan),
// then reads each OCI image's metadata from its manifest annotations
// (resolve).
package catalog

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"

	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/signature"
	"github.com/sylva-projects/osimages/internal/values"
)

// Source is one image the values ask for, before its metadata is resolved.
type Source struct {
	Key string `json:"key"`
	URI string `json:"uri"`
	// RegistryKey is the os_images_oci_registries key of a diskimage-builder
	// image, empty for a hand-declared one.
	RegistryKey string `json:"registryKey,omitempty"`
	// Declared are the hand-declared fields of os_images; they win over the
	// annotations of the same name.
	Declared osimage.Image `json:"declared,omitempty"`
	// SigningKeys are the cosign keys the image's manifest must be signed
	// with (signature.Policy.KeysFor); empty when none applies or the check
	// is off. They are part of the inputs hash: a new key resolves again.
	SigningKeys signature.Keys `json:"signingKeys,omitempty"`
}

// IsOCI says whether the image's metadata comes from an OCI manifest.
func (s Source) IsOCI() bool { return strings.HasPrefix(s.URI, "oci://") }

// Plan is every image to resolve, sorted by key.
type Plan struct {
	Sources []Source `json:"sources"`
	// Insecure is oci_registry_insecure.
	Insecure bool `json:"insecure"`
	// SkipSigningCheck is security.os_images.skip_signing_check.
	SkipSigningCheck bool `json:"skipSigningCheck,omitempty"`
	// RequireSignatures is security.os_images.require_signatures: an OCI
	// image without SigningKeys is refused.
	RequireSignatures bool `json:"requireSignatures,omitempty"`
	// KeyedRegistries names the registries that have a cosign_publickey,
	// checked or not, for the log line that says the check is off.
	KeyedRegistries []string `json:"-"`
}

// planFormat versions the inputs hash: bump it when the meaning of a plan
// changes, so that clusters resolve again after an upgrade. v2: signatures
// are verified and the manifest digest is recorded (oci-manifest-digest).
const planFormat = "osimages.catalog/v2"

// InputsHash identifies the plan: equal plans resolve to the same catalog as
// long as the registries' tags do not move.
func (p Plan) InputsHash() string {
	data, _ := json.Marshal(struct {
		Format string `json:"format"`
		Plan
	}{planFormat, p})
	sum := sha256.Sum256(data)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// Unchecked lists the keys of the OCI images that no signing key applies
// to: they are published unchecked, or refused under RequireSignatures.
func (p Plan) Unchecked() []string {
	var out []string
	for _, s := range p.Sources {
		if s.IsOCI() && len(s.SigningKeys) == 0 {
			out = append(out, s.Key)
		}
	}
	return out
}

// PlanFromValues is PlanFromValuesContext without a deadline: the bounds
// of template expansion alone hold it.
func PlanFromValues(v values.Values, filter *regexp.Regexp) (Plan, error) {
	return PlanFromValuesContext(context.Background(), v, filter)
}

// PlanFromValuesContext lists the images of sylva_diskimagebuilder_images
// and os_images (contract §2). A filter, when given, keeps the images
// whose key or registry key it fully matches. Every fault of the values is
// reported, each with its values path, in an *InputError; when ctx ends
// first, its error is returned instead.
func PlanFromValuesContext(ctx context.Context, v values.Values, filter *regexp.Regexp) (Plan, error) {
	var errs []error
	fail := func(err error) { errs = append(errs, err) }
	// A look-alike of a key read here would silently drop its value.
	errs = append(errs, ValuesNearMisses(v)...)

	insecure, err := values.Bool(v, "oci_registry_insecure", "oci_registry_insecure", false)
	if err != nil {
		fail(err)
	}
	registries, err := registriesFromValues(values.NewRenderer(ctx, v), v, true)
	if err != nil {
		fail(err)
	}
	skip, require, err := signatureSwitches(v)
	if err != nil {
		fail(err)
	}
	policy := policyOf(registries, skip, require)

	sources := map[string]Source{}
	// registryPrefix is, for a diskimage-builder image, where its registry
	// keeps images.
	registryPrefix := map[string]string{}
	dib, err := values.Map(v, "sylva_diskimagebuilder_images", "sylva_diskimagebuilder_images")
	if err != nil {
		fail(err)
	}
	for _, key := range slices.Sorted(maps.Keys(dib)) {
		path := "sylva_diskimagebuilder_images." + key
		if err := osimage.ValidateKey(key); err != nil {
			fail(fmt.Errorf("%s: %w", path, err))
			continue
		}
		entry, err := values.Map(dib, key, path)
		if err != nil {
			fail(err)
			continue
		}
		if enabled, err := values.Bool(entry, "enabled", path+".enabled", true); err != nil {
			fail(err)
			continue
		} else if !enabled {
			continue
		}
		regKey, err := values.String(entry, "os_images_oci_registry", path+".os_images_oci_registry")
		if err != nil {
			fail(err)
			continue
		}
		reg, ok := registries[regKey]
		if !ok {
			// A registry that is declared but could not be read has its
			// own error already: saying it is not defined would be wrong.
			if !declaredRegistry(v, regKey) {
				fail(fmt.Errorf("%s.os_images_oci_registry ('%s') is not defined in os_images_oci_registries", path, regKey))
			}
			continue
		}
		if !reg.enabled {
			continue
		}
		registryPrefix[key] = strings.TrimSuffix(reg.url, "/") + "/"
		sources[key] = Source{
			Key:         key,
			URI:         registryPrefix[key] + key + ":" + reg.tag,
			RegistryKey: regKey,
		}
	}

	declared, err := values.Map(v, "os_images", "os_images")
	if err != nil {
		fail(err)
	}
	for _, key := range slices.Sorted(maps.Keys(declared)) {
		path := "os_images." + key
		if err := osimage.ValidateKey(key); err != nil {
			fail(fmt.Errorf("%s: %w", path, err))
			continue
		}
		if declared[key] == nil {
			// A null entry declares nothing, as a null removes a key when
			// Helm merges values; a diskimage-builder image of that name
			// stays as resolved.
			continue
		}
		fields, err := declaredFields(path, declared[key])
		if err != nil {
			fail(err)
			continue
		}
		uri, err := validateDeclared(path, fields)
		if err != nil {
			fail(err)
			continue
		}
		src, fromDIB := sources[key]
		src.Key = key
		src.Declared = fields
		if uri != "" {
			src.URI = uri
		}
		if src.URI == "" {
			fail(fmt.Errorf("%s.uri: missing; give the oci:// or http(s):// address of the image", path))
			continue
		}
		// The fields derived from a registry describe an image that comes
		// from it: a declared uri that points elsewhere drops them, unless
		// they are declared too (then they are part of Declared).
		if !fromDIB || !strings.HasPrefix(src.URI, registryPrefix[key]) {
			src.RegistryKey = ""
		}
		sources[key] = src
	}
	if err := ctx.Err(); err != nil {
		return Plan{}, context.Cause(ctx)
	}
	if len(errs) > 0 {
		return Plan{}, &InputError{Errs: errs}
	}

	plan := Plan{Insecure: insecure, SkipSigningCheck: skip, RequireSignatures: require}
	for _, k := range policy.Keys {
		plan.KeyedRegistries = append(plan.KeyedRegistries, k.Registry)
	}
	for _, key := range slices.Sorted(maps.Keys(sources)) {
		s := sources[key]
		if filter != nil && !filter.MatchString(s.Key) && (s.RegistryKey == "" || !filter.MatchString(s.RegistryKey)) {
			continue
		}
		s.SigningKeys = policy.KeysFor(s.RegistryKey, s.URI)
		plan.Sources = append(plan.Sources, s)
	}
	return plan, nil
}

// CompileFilter anchors a filter expression, as selector patterns are, so
// that "ubuntu" does not also pick "ubuntu-hardened". Its error quotes
// expr; the caller names where expr came from.
func CompileFilter(expr string) (*regexp.Regexp, error) {
	if expr == "" {
		return nil, nil
	}
	re, err := regexp.Compile("^(?:" + expr + ")$")
	if err != nil {
		return nil, fmt.Errorf("%q is not a regular expression: %w", expr, err)
	}
	return re, nil
}

// stringFields are the fields the contract reads as strings (the image
// server, render, the catalog itself): declared otherwise, they are refused
// here rather than published for a consumer to trip on.
var stringFields = []string{
	osimage.FieldURI, osimage.FieldSHA256, osimage.FieldMD5, osimage.FieldFilename, osimage.FieldImageFormat,
	osimage.FieldCompression, osimage.FieldSize, osimage.FieldArchiveSize, osimage.FieldManifestDigest, osimage.FieldRegistryKey,
}

// declaredFields reads the hand-declared fields of one os_images entry.
// They are published as written: strings, booleans, maps and lists are
// kept, and a null removes the field (an annotation of that name too), as
// a null removes a key when Helm merges values. A number is refused: YAML
// decoding has already turned 15.10 into 15.1, and publishing either form
// would change what the author wrote.
func declaredFields(path string, raw any) (osimage.Image, error) {
	m, ok := raw.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("%s: must be a map of image fields, got %s", path, osimage.Describe(raw))
	}
	img := osimage.Image(m).Clone()
	var errs []error
	for _, f := range slices.Sorted(maps.Keys(img)) {
		switch v := img[f].(type) {
		case float64, int, int64:
			errs = append(errs, fmt.Errorf("%s.%s: is a YAML number (%s), whose text is lost once read (15.10 reads as 15.1): quote it as written, as in %s: \"15.10\"", path, f, osimage.Describe(v), f))
		}
	}
	for _, f := range stringFields {
		switch v := img[f].(type) {
		case nil, string, float64, int, int64: // absent, removed, fine, or reported above
		default:
			errs = append(errs, fmt.Errorf("%s.%s: must be a string, got %s", path, f, osimage.Describe(v)))
		}
	}
	return img, errors.Join(errs...)
}

// validateDeclared checks what an os_images entry declares, and returns
// its uri, "" when it declares none.
func validateDeclared(path string, fields osimage.Image) (string, error) {
	errs := []error{checkIdentity(fields, path+".")}
	for _, f := range []string{osimage.FieldSize, osimage.FieldArchiveSize} {
		if _, err := fields.Size(f); err != nil {
			errs = append(errs, fmt.Errorf("%s.%w", path, err))
		}
	}
	uri := fields.Get(osimage.FieldURI)
	if uri != "" && !hasScheme(uri, "oci://", "http://", "https://") {
		errs = append(errs, fmt.Errorf("%s.uri: %q must start with oci://, http:// or https://", path, uri))
	}
	return uri, errors.Join(errs...)
}

// checkIdentity applies the rules of an image's identity (osimage) to the
// sha256, md5 and filename that img holds, so that the catalog publishes
// nothing that the image server or render would refuse: an uppercase
// sha256, or a filename with a newline that would write a second line into
// the served .sha256sum file. prefix names where the fields come from.
func checkIdentity(img osimage.Image, prefix string) error {
	var errs []error
	if s, ok := img[osimage.FieldSHA256].(string); ok {
		if _, err := osimage.ParseSHA256(s); err != nil {
			errs = append(errs, fmt.Errorf("%s%s: %w", prefix, osimage.FieldSHA256, err))
		}
	}
	if s, ok := img[osimage.FieldMD5].(string); ok {
		if err := osimage.ValidateMD5(s); err != nil {
			errs = append(errs, fmt.Errorf("%s%s: %w", prefix, osimage.FieldMD5, err))
		}
	}
	if s, ok := img[osimage.FieldFilename].(string); ok {
		if err := osimage.ValidateFilename(s); err != nil {
			errs = append(errs, fmt.Errorf("%s%s: %w", prefix, osimage.FieldFilename, err))
		}
	}
	return errors.Join(errs...)
}

func hasScheme(uri string, schemes ...string) bool {
	for _, s := range schemes {
		if strings.HasPrefix(uri, s) {
			return true
		}
	}
	return false
}

type registry struct {
	url, tag string
	enabled  bool
	// cosignKey is the key of cosign_publickey, nil when none.
	cosignKey *signature.Key
}

// registriesFromValues reads os_images_oci_registries, rendering url and
// tag with r (within its bounds). needTag is false for the image server,
// which only needs each registry's url and key.
func registriesFromValues(r *values.Renderer, v values.Values, needTag bool) (map[string]registry, error) {
	raw, err := values.Map(v, "os_images_oci_registries", "os_images_oci_registries")
	if err != nil {
		return nil, err
	}
	out := map[string]registry{}
	var errs []error
	for _, key := range slices.Sorted(maps.Keys(raw)) {
		path := "os_images_oci_registries." + key
		entry, err := values.Map(raw, key, path)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		var reg registry
		var e1, e2, e3, e4 error
		reg.enabled, e1 = values.Bool(entry, "enabled", path+".enabled", true)
		reg.url, e2 = renderField(r, entry, "url", path)
		if needTag {
			reg.tag, e3 = renderField(r, entry, "tag", path)
		}
		reg.cosignKey, e4 = cosignKey(key, entry, path)
		if err := errors.Join(e1, e2, e3, e4); err != nil {
			errs = append(errs, err)
			continue
		}
		if reg.enabled && !strings.HasPrefix(reg.url, "oci://") {
			errs = append(errs, fmt.Errorf("%s.url: %q must start with oci://", path, reg.url))
			continue
		}
		out[key] = reg
	}
	return out, errors.Join(errs...)
}

// declaredRegistry says whether os_images_oci_registries has key, readable
// or not.
func declaredRegistry(v values.Values, key string) bool {
	raw, err := values.Map(v, "os_images_oci_registries", "os_images_oci_registries")
	_, ok := raw[key]
	return err == nil && ok
}

func renderField(r *values.Renderer, entry values.Values, field, path string) (string, error) {
	s, err := values.String(entry, field, path+"."+field)
	if err != nil {
		return "", err
	}
	s, err = r.Render(s, path+"."+field)
	if err != nil {
		return "", err
	}
	if s == "" {
		return "", fmt.Errorf("%s.%s: missing", path, field)
	}
	return s, nil
}

// InputError lists the faults of the values. Callers exit 2 on it.
type InputError struct{ Errs []error }

func (e *InputError) Error() string {
	lines := make([]string, len(e.Errs))
	for i, err := range e.Errs {
		lines[i] = err.Error()
	}
	return strings.Join(lines, "\n")
}

func (e *InputError) Unwrap() []error { return e.Errs }
