package containerimage

import (
	"archive/tar"
	"errors"
	"io"
	"path"
	"slices"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// Files lists the regular files and directories of the image's layers with
// their modes and owners, for checks.
func Files(img v1.Image) (map[string]*tar.Header, error) {
	layers, err := img.Layers()
	if err != nil {
		return nil, err
	}
	out := map[string]*tar.Header{}
	for _, l := range slices.Backward(layers) {
		rc, err := l.Uncompressed()
		if err != nil {
			return nil, err
		}
		tr := tar.NewReader(rc)
		for {
			h, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				rc.Close()
				return nil, err
			}
			if _, seen := out[path.Clean(h.Name)]; !seen {
				out[path.Clean(h.Name)] = h
			}
		}
		rc.Close()
	}
	return out, nil
}
