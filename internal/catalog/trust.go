package catalog

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/sylva-projects/osimages/internal/signature"
	"github.com/sylva-projects/osimages/internal/values"
)

// The values paths of the signature switches, which the catalog reads.
const (
	SkipPath    = signature.SkipPath
	RequirePath = signature.RequirePath
)

// PolicyFromValues reads the signature policy of values: the cosign keys
// of os_images_oci_registries, security.os_images.skip_signing_check and
// require_signatures. Every fault is reported with its values path; the
// image server refuses to pull OCI images while the policy cannot be
// read, rather than pull them unchecked.
func PolicyFromValues(v values.Values) (signature.Policy, error) {
	regs, err := registriesFromValues(values.NewRenderer(context.Background(), v), v, false)
	skip, require, policyErr := signatureSwitches(v)
	var errs []error
	for _, e := range []error{err, policyErr} {
		if e != nil {
			errs = append(errs, e)
		}
	}
	if len(errs) > 0 {
		return signature.Policy{}, &InputError{Errs: errs}
	}
	return policyOf(regs, skip, require), nil
}

func policyOf(regs map[string]registry, skip, require bool) signature.Policy {
	p := signature.Policy{Skip: skip, Require: require}
	for _, key := range slices.Sorted(maps.Keys(regs)) {
		if r := regs[key]; r.cosignKey != nil {
			k := *r.cosignKey
			k.URL = r.url
			p.Keys = append(p.Keys, k)
		}
	}
	return p
}

// signatureSwitches reads skip_signing_check and require_signatures, which
// contradict each other when both are true.
func signatureSwitches(v values.Values) (skip, require bool, err error) {
	security, err := values.Map(v, "security", "security")
	if err != nil {
		return false, false, err
	}
	osImages, err := values.Map(security, "os_images", "security.os_images")
	if err != nil {
		return false, false, err
	}
	skip, e1 := values.Bool(osImages, "skip_signing_check", SkipPath, false)
	require, e2 := values.Bool(osImages, "require_signatures", RequirePath, false)
	if err := errors.Join(e1, e2); err != nil {
		return false, false, err
	}
	if skip && require {
		return false, false, fmt.Errorf("%s and %s are both true: choose one (require refuses unsigned images, skip checks none)", SkipPath, RequirePath)
	}
	return skip, require, nil
}

// cosignKey reads and parses the cosign_publickey of registry key, so that
// a broken key is a values error (exit 2) rather than a refusal of every
// image. It returns nil when there is none.
func cosignKey(key string, entry values.Values, path string) (*signature.Key, error) {
	s, err := values.String(entry, "cosign_publickey", path+".cosign_publickey")
	if err != nil {
		return nil, err
	}
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	k, err := signature.NewKey(key, "", s)
	if err != nil {
		return nil, fmt.Errorf("%s.cosign_publickey: %w", path, err)
	}
	return &k, nil
}
