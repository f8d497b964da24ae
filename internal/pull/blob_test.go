package pull

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/sylva-projects/osimages/internal/devregistry"
	"github.com/sylva-projects/osimages/internal/oci"
)

// blobDest is a memDest that keeps the blob (a BlobKeeper).
type blobDest struct {
	memDest
	blob         bytes.Buffer
	digest       string
	size         int64
	blobRequests int
}

func (d *blobDest) BlobWriter(digest string, size int64) (io.Writer, error) {
	d.blob.Reset()
	d.digest, d.size = digest, size
	d.blobRequests++
	return &d.blob, nil
}

// TestPullKeepsTheBlobForPeers: a gzip layer's network bytes reach a
// BlobKeeper as they are; an HTTP pull of those bytes with their digest
// verifies that digest, and refuses them corrupted.
func TestPullKeepsTheBlobForPeers(t *testing.T) {
	reg := newRegistry(t, devregistry.Options{})
	content := devregistry.DiskContent(3<<20+9, 3)
	src, _ := publish(t, reg, "dib/blob", content, true, nil)
	p := fastPuller(ociClient(t, oci.Options{Insecure: true}))
	var dst blobDest
	res, err := p.Pull(context.Background(), src, &dst, nil)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(dst.blob.Bytes())
	if dst.digest != res.BlobDigest || "sha256:"+hex.EncodeToString(sum[:]) != res.BlobDigest || dst.size != int64(dst.blob.Len()) {
		t.Fatalf("blob kept: digest %s size %d, %d bytes of sha256 %x; the layer is %s", dst.digest, dst.size, dst.blob.Len(), sum, res.BlobDigest)
	}
	if !bytes.Equal(dst.Bytes(), content) {
		t.Fatal("the image written is not the content")
	}

	// A raw layer keeps nothing: the image is the blob.
	rawSrc, _ := publish(t, reg, "dib/blob-raw", content, false, nil)
	var raw blobDest
	if _, err := p.Pull(context.Background(), rawSrc, &raw, nil); err != nil || raw.blobRequests != 0 {
		t.Fatalf("raw layer: %v, %d blob writers asked", err, raw.blobRequests)
	}

	blob := bytes.Clone(dst.blob.Bytes())
	for _, corrupt := range []bool{false, true} {
		body := bytes.Clone(blob)
		if corrupt {
			// The gzip header's MTIME: the file decompresses the same, only
			// the blob digest tells.
			body[4] ^= 0xff
		}
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.ServeContent(w, r, "blob", time.Time{}, bytes.NewReader(body))
		}))
		peerSrc := Source{URI: srv.URL + "/peer/blobs/x", SHA256: src.SHA256, MD5: src.MD5, Size: src.Size,
			Compression: "gz", BlobDigest: res.BlobDigest, ArchiveSize: int64(len(body))}
		var got memDest
		_, err := p.Pull(context.Background(), peerSrc, &got, nil)
		srv.Close()
		switch {
		case !corrupt && err != nil:
			t.Fatalf("the blob from a peer: %v", err)
		case !corrupt && !bytes.Equal(got.Bytes(), content):
			t.Fatal("the blob from a peer did not give the content")
		case corrupt:
			verifyError(t, err, WhatBlobDigest)
		}
	}
}
