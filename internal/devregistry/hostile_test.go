package devregistry

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/klauspost/compress/gzip"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// TestFaults checks each hostile behaviour from a plain HTTP client, as
// the pullers under test meet them.
func TestFaults(t *testing.T) {
	ctx := context.Background()
	faults := &Faults{}
	reg, err := Start(ctx, Options{RootDirectory: t.TempDir(), Middleware: faults.Middleware})
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	content := DiskContent(256<<10, 3)
	p, err := reg.Publish(ctx, DiskImage{Repository: "dib/hostile", Tag: "1.0", Content: content})
	if err != nil {
		t.Fatal(err)
	}
	blobURL := reg.URL() + "/v2/dib/hostile/blobs/" + p.LayerDigest.String()
	get := func(url string, timeout time.Duration) (*http.Response, []byte, error) {
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		req.Header.Set("Accept", ocispec.MediaTypeImageManifest)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return nil, nil, err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		return resp, body, err
	}

	t.Run("untouched", func(t *testing.T) {
		_, body, err := get(blobURL, 10*time.Second)
		if err != nil || !bytes.Equal(body, content) {
			t.Fatalf("%d bytes, %v", len(body), err)
		}
	})
	t.Run("corrupt", func(t *testing.T) {
		faults.Set("dib/hostile", Blobs, Corrupt(1000))
		defer faults.Clear("dib/hostile")
		_, body, err := get(blobURL, 10*time.Second)
		if err != nil || len(body) != len(content) || digest.FromBytes(body) == p.LayerDigest || body[1000] == content[1000] {
			t.Fatalf("%d bytes, %v: want the same length with byte 1000 flipped", len(body), err)
		}
	})
	t.Run("stall after headers", func(t *testing.T) {
		faults.Set("dib/hostile", Blobs, StallAfterHeaders())
		defer faults.Clear("dib/hostile")
		resp, body, err := get(blobURL, time.Second)
		if resp == nil || resp.StatusCode != 200 || len(body) != 0 || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("%v, %d bytes, %v: want headers, then nothing", resp, len(body), err)
		}
	})
	t.Run("stall mid-blob", func(t *testing.T) {
		faults.Set("dib/hostile", Blobs, StallAfter(100<<10))
		defer faults.Clear("dib/hostile")
		_, body, err := get(blobURL, time.Second)
		if len(body) != 100<<10 || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("%d bytes, %v: want 100 KiB, then nothing", len(body), err)
		}
	})
	t.Run("trickle", func(t *testing.T) {
		faults.Set("dib/hostile", Blobs, Trickle(1000, 100*time.Millisecond))
		defer faults.Clear("dib/hostile")
		_, body, err := get(blobURL, 550*time.Millisecond)
		if len(body) < 1000 || len(body) > 7000 || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("%d bytes, %v: want about 1000 bytes per 100ms", len(body), err)
		}
	})
	t.Run("longer", func(t *testing.T) {
		faults.Set("dib/hostile", Blobs, Longer(12345))
		defer faults.Clear("dib/hostile")
		resp, body, err := get(blobURL, 10*time.Second)
		if err != nil || resp.ContentLength != -1 || len(body) != len(content)+12345 || !bytes.Equal(body[:len(content)], content) {
			t.Fatalf("Content-Length %d, %d bytes, %v", resp.ContentLength, len(body), err)
		}
	})
	t.Run("stalled manifest", func(t *testing.T) {
		faults.Set("dib/hostile", Manifests, StallAfterHeaders())
		defer faults.Clear("dib/hostile")
		resp, body, err := get(reg.URL()+"/v2/dib/hostile/manifests/1.0", time.Second)
		if resp == nil || resp.StatusCode != 200 || len(body) != 0 || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("%v, %d bytes, %v", resp, len(body), err)
		}
		// Blobs of the same repository are untouched.
		if _, body, err := get(blobURL, 10*time.Second); err != nil || !bytes.Equal(body, content) {
			t.Fatalf("blob: %d bytes, %v", len(body), err)
		}
	})
}

func TestPublishHostileLayers(t *testing.T) {
	ctx := context.Background()
	reg, err := Start(ctx, Options{RootDirectory: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	bomb := GzipBomb(64 << 20)
	if len(bomb) > 256<<10 {
		t.Errorf("a 64 MiB bomb weighs %d bytes", len(bomb))
	}
	zr, err := gzip.NewReader(bytes.NewReader(bomb))
	if err != nil {
		t.Fatal(err)
	}
	if n, err := io.Copy(io.Discard, zr); err != nil || n != 64<<20 {
		t.Fatalf("the bomb expands to %d bytes, %v", n, err)
	}
	p, err := reg.Publish(ctx, DiskImage{Repository: "dib/bomb", Tag: "1.0", Gzip: true, Layer: bomb, LayerSize: 7})
	if err != nil {
		t.Fatal(err)
	}
	repo, err := reg.Repository("dib/bomb")
	if err != nil {
		t.Fatal(err)
	}
	_, rc, err := repo.FetchReference(ctx, "1.0")
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	var m ocispec.Manifest
	if err := json.NewDecoder(rc).Decode(&m); err != nil {
		t.Fatal(err)
	}
	if m.Layers[0].Digest != digest.FromBytes(bomb) || m.Layers[0].Size != 7 || p.LayerDigest != digest.FromBytes(bomb) {
		t.Errorf("layer %+v: want the bomb's digest with the lying size 7", m.Layers[0])
	}
	if p.Fields.Get("archive-size") != strconv.Itoa(len(bomb)) {
		t.Errorf("archive-size %s: the fields keep the true size %d", p.Fields.Get("archive-size"), len(bomb))
	}
}
