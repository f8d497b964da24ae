package pull

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sylva-projects/osimages/internal/devregistry"
	"github.com/sylva-projects/osimages/internal/oci"
	"github.com/sylva-projects/osimages/internal/osimage"
)

// TestPullManifestDeadline: a registry that sends a manifest's headers and
// then nothing fails the pull after ManifestTimeout, before any blob is
// asked for.
func TestPullManifestDeadline(t *testing.T) {
	faults := &devregistry.Faults{}
	reg := registryWith(t, faults.Middleware)
	src, _ := publish(t, reg, "dib/stalled-manifest", devregistry.DiskContent(1<<20, 3), true, nil)
	faults.Set("dib/stalled-manifest", devregistry.Manifests, devregistry.StallAfterHeaders())
	p := fastPuller(ociClient(t, oci.Options{Insecure: true}))
	p.ManifestTimeout = 500 * time.Millisecond
	start := time.Now()
	_, err := p.Pull(context.Background(), src, &memDest{}, nil)
	if err == nil || !strings.Contains(err.Error(), "no manifest within 500ms") || !strings.Contains(err.Error(), src.URI) {
		t.Fatalf("error = %v, want the manifest deadline, naming the image", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("the stalled manifest held the pull for %v", d)
	}
}

// TestPullRefusesLyingLayerSizes: the layer's bytes are not as long as the
// manifest says, either way; nothing is accepted.
func TestPullRefusesLyingLayerSizes(t *testing.T) {
	faults := &devregistry.Faults{}
	reg := registryWith(t, faults.Middleware)
	content := devregistry.DiskContent(1<<20, 5)
	ctx := context.Background()
	p := fastPuller(ociClient(t, oci.Options{Insecure: true}))

	t.Run("manifest announces less", func(t *testing.T) {
		pub, err := reg.Publish(ctx, devregistry.DiskImage{Repository: "dib/short", Tag: "1.0", Content: content, Gzip: true, LayerSize: 1000})
		if err != nil {
			t.Fatal(err)
		}
		fields := pub.Fields.Clone()
		delete(fields, osimage.FieldArchiveSize) // nothing else to tell the lie by
		_, err = p.Pull(ctx, sourceOf("oci://"+pub.Ref, fields), &memDest{}, nil)
		verifyError(t, err, WhatDownloadSize)
	})
	t.Run("registry sends more", func(t *testing.T) {
		src, _ := publish(t, reg, "dib/longer", content, true, nil)
		faults.Set("dib/longer", devregistry.Blobs, devregistry.Longer(64<<10))
		dst := &memDest{}
		_, err := p.Pull(ctx, src, dst, nil)
		verifyError(t, err, WhatDownloadSize)
	})
}
