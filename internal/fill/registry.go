package fill

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"github.com/opencontainers/go-digest"

	"github.com/sylva-projects/osimages/internal/catalog"
	"github.com/sylva-projects/osimages/internal/imagestore"
	"github.com/sylva-projects/osimages/internal/oci"
	"github.com/sylva-projects/osimages/internal/pull"
	"github.com/sylva-projects/osimages/internal/servedset"
	"github.com/sylva-projects/osimages/internal/signature"
	"github.com/sylva-projects/osimages/internal/values"
)

// Registries is how the server reaches registries under the management
// values in force: with TLS verified or not (oci_registry_insecure), and
// under which signature policy. Until Apply has read the first values, no
// OCI image is pulled: the server fails closed.
type Registries struct {
	secure, insecure *pull.Puller
	useInsecure      atomic.Bool
	policy           atomic.Pointer[policyState]
	log              *slog.Logger
}

// policyState is the signature policy read from the values last applied,
// or why it could not be.
type policyState struct {
	policy signature.Policy
	err    error
}

// NewRegistries pulls through clients. A connection that stalls is resumed
// (a new request at the same offset) after half the stall timeout; the
// server cuts the download at the full one.
func NewRegistries(clients oci.Clients, stall time.Duration, log *slog.Logger) *Registries {
	puller := func(c *oci.Client) *pull.Puller {
		return &pull.Puller{OCI: c, HTTP: c.HTTPClient(), IdleTimeout: stall / 2, ManifestTimeout: stall}
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Registries{secure: puller(clients.Secure), insecure: puller(clients.Insecure), log: log}
}

// Fill fills an image from its registry as the values last applied say.
func (r *Registries) Fill() func(ctx context.Context, w servedset.Wanted, dst *imagestore.Writer, progress func(received, total int64)) (pull.Result, error) {
	return PullWith(r.puller, func() (signature.Policy, error) {
		if p := r.policy.Load(); p != nil {
			return p.policy, p.err
		}
		return signature.Policy{}, errors.New("the management values are not read yet")
	})
}

func (r *Registries) puller() *pull.Puller {
	if r.useInsecure.Load() {
		return r.insecure
	}
	return r.secure
}

// Apply puts in force the registry settings of the management values:
// oci_registry_insecure and the signature policy, whose scope it logs. It
// returns why the policy cannot be read: OCI images are then not pulled
// until values that can be read are applied.
func (r *Registries) Apply(vals values.Values) error {
	insecure, _ := values.Bool(vals, "oci_registry_insecure", "oci_registry_insecure", false)
	r.useInsecure.Store(insecure)
	p, err := catalog.PolicyFromValues(vals)
	r.policy.Store(&policyState{policy: p, err: err})
	switch {
	case err != nil:
		err = fmt.Errorf("OCI images are not pulled until the cosign keys can be read: %w", err)
		r.log.Error("signature policy unreadable", "error", err)
	case p.Skip && len(p.Keys) > 0:
		r.log.Warn(signature.SkipPath+" is true: cosign signatures are NOT checked", "registriesWithKey", len(p.Keys))
	case len(p.Keys) > 0 || p.Require:
		// Name the scope of the check: an OCI image under no keyed
		// registry is not checked unless signatures are required.
		var keyed []string
		for _, k := range p.Keys {
			keyed = append(keyed, k.Registry+"="+k.URL)
		}
		others := "pulled unchecked (" + signature.RequirePath + ": true refuses them)"
		if p.Require {
			others = "refused (" + signature.RequirePath + ")"
		}
		r.log.Info("cosign signatures are checked before the download of images under these registries", "registries", keyed, "otherOCIImages", others)
	}
	return err
}

// PullWith adapts a puller to a fill function. choose is asked for the puller at
// each pull, since oci_registry_insecure can change with the values; policy
// likewise gives the signature policy of the management values in force.
// Before any byte of an OCI image is downloaded, the manifest the tag
// resolves to must be the one the image record pins (oci-manifest-digest),
// and must carry a signature made with every key that applies to the image
// (signature.Policy.KeysFor). While policy reports an error, OCI images are
// not pulled at all. A nil policy checks no signature.
func PullWith(choose func() *pull.Puller, policy func() (signature.Policy, error)) func(ctx context.Context, w servedset.Wanted, dst *imagestore.Writer, progress func(received, total int64)) (pull.Result, error) {
	return func(ctx context.Context, w servedset.Wanted, dst *imagestore.Writer, progress func(int64, int64)) (pull.Result, error) {
		src := PullSource(w)
		if policy != nil {
			check, err := signatureCheck(w, policy)
			if err != nil {
				return pull.Result{}, err
			}
			src.CheckManifest = check
		}
		return choose().Pull(ctx, src, dst, progress)
	}
}

// signatureCheck is the check of w's manifest that the management values
// ask for, nil when no key applies to it.
func signatureCheck(w servedset.Wanted, policy func() (signature.Policy, error)) (func(context.Context, *oci.Client, digest.Digest) error, error) {
	uri := w.Desc.URI
	if !strings.HasPrefix(uri, "oci://") {
		return nil, nil
	}
	p, err := policy()
	if err != nil {
		return nil, fmt.Errorf("pulling %s: not pulled, since the cosign keys that apply to it cannot be read from the management values: %w", uri, err)
	}
	keys, err := p.KeysRequired(w.Desc.RegistryKey, uri)
	if err != nil {
		return nil, fmt.Errorf("%w (nothing was downloaded)", err)
	}
	if len(keys) == 0 {
		return nil, nil
	}
	return func(ctx context.Context, client *oci.Client, d digest.Digest) error {
		return keys.Verify(ctx, signature.Verifier{Client: client}, uri, d, " of the management values; nothing was downloaded")
	}, nil
}

// PullSource is what the puller needs to know of w.
func PullSource(w servedset.Wanted) pull.Source {
	return pull.Source{
		URI:            w.Desc.URI,
		SHA256:         w.SHA256,
		MD5:            w.Desc.MD5,
		Compression:    w.Desc.Compression,
		Size:           w.Desc.Size,
		ArchiveSize:    w.Desc.ArchiveSize,
		ManifestDigest: w.Desc.ManifestDigest,
	}
}
