package signature_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/sylva-projects/osimages/internal/devregistry"
	"github.com/sylva-projects/osimages/internal/oci"
	"github.com/sylva-projects/osimages/internal/signature"
	"github.com/sylva-projects/osimages/internal/testenv"
)

// TestVerifyReadsEveryReferrer: an artifact re-signed over the years keeps
// the signatures of keys since rotated, and the valid one may be listed
// last, on a later page; every one is tried, up to oci.MaxReferrers.
func TestVerifyReadsEveryReferrer(t *testing.T) {
	ctx := context.Background()
	other := testenv.Signer(t)
	for _, c := range []struct {
		name string
		api  *devregistry.ReferrersAPI
	}{
		{"referrers tag schema", nil},
		{"referrers API, 3 a page", &devregistry.ReferrersAPI{PageSize: 3}},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFixtureWith(t, c.api)
			uri, d := f.publish(t, "dib/rotated", "1.0", 61)
			for range 20 {
				f.sign(t, other, "dib/rotated", d, devregistry.SignOptions{Bundle: true})
			}
			wantRefused(t, f.verifier.Verify(ctx, uri, d, f.key), signature.ErrOtherKey, uri, "(Sigstore bundle)")
			f.sign(t, f.signer, "dib/rotated", d, devregistry.SignOptions{Bundle: true})
			if err := f.verifier.Verify(ctx, uri, d, f.key); err != nil {
				t.Fatalf("the 21st signature is ours: %v", err)
			}
		})
	}

	t.Run("a listed signature that is gone", func(t *testing.T) {
		// The tag schema keeps a deleted referrer listed: it is no
		// verdict on the next one.
		f := newFixtureWith(t, &devregistry.ReferrersAPI{Padding: 5, PaddingArtifactType: "application/vnd.dev.sigstore.bundle.v0.3+json"})
		uri, d := f.publish(t, "dib/gone", "1.0", 62)
		wantRefused(t, f.verifier.Verify(ctx, uri, d, f.key), signature.ErrMalformed, uri, "listed among the referrers, but the registry has no such manifest")
		f.sign(t, f.signer, "dib/gone", d, devregistry.SignOptions{Bundle: true})
		if err := f.verifier.Verify(ctx, uri, d, f.key); err != nil {
			t.Fatal(err)
		}
	})

	bound := fmt.Sprintf("more than %d", oci.MaxReferrers)
	t.Run("more referrers than the bound", func(t *testing.T) {
		// The valid signature is the 1,001st referrer: not read, and the
		// refusal names the bound and the way out.
		f := newFixtureWith(t, &devregistry.ReferrersAPI{PageSize: 100, Padding: oci.MaxReferrers})
		uri, d := f.publish(t, "dib/crowded", "1.0", 63)
		f.sign(t, f.signer, "dib/crowded", d, devregistry.SignOptions{Bundle: true})
		wantRefused(t, f.verifier.Verify(ctx, uri, d, f.key), signature.ErrTooManyReferrers, uri,
			bound, "found no signature among the first", "delete stale signatures")
		// A valid .sig tag settles it before the referrers are listed.
		f.sign(t, f.signer, "dib/crowded", d, devregistry.SignOptions{})
		if err := f.verifier.Verify(ctx, uri, d, f.key); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("a registry that pages for ever", func(t *testing.T) {
		f := newFixtureWith(t, &devregistry.ReferrersAPI{EmptyPages: 1 << 30})
		uri, d := f.publish(t, "dib/endless", "1.0", 64)
		wantRefused(t, f.verifier.Verify(ctx, uri, d, f.key), signature.ErrTooManyReferrers, uri,
			fmt.Sprintf("more than %d pages", oci.MaxReferrers))
	})
}
