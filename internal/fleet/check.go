package fleet

import (
	"fmt"
	"strings"

	"github.com/sylva-projects/osimages/internal/osimage"
)

// Check compares what a namespace needs with the served set it holds. An
// image of the set that is not served under a filename its URLs ask for
// is not served: that URL answers 404, whatever the set says. When the
// copy carries no filenames (a server that does not publish them), only
// the sha256 is compared.
func Check(namespace, servedSetName string, needs []Need, served osimage.ServedOutput, servedFound bool, needErr error) osimage.CheckReport {
	r := osimage.CheckReport{Namespace: namespace, ServedSet: servedSetName, ServedSetFound: servedFound, Images: group(needs)}
	for i := range r.Images {
		img := &r.Images[i]
		entry, ok := served.Set[img.SHA256]
		missing := unservedFilenames(served.Filenames, *img)
		wrong := unservedManifests(served.OCI, *img)
		switch {
		case !ok:
			img.State = osimage.StateNotServed
		case len(missing) > 0:
			img.State = osimage.StateNotServed
			img.Message = filenameMessage(img.SHA256, img.ImageKey, missing, served.Filenames[img.SHA256])
			continue
		case len(wrong) > 0:
			img.State = osimage.StateNotServed
			img.Message = fmt.Sprintf("image %s/%s is served through oci:// under manifest %s, not %s: oci://<host>/%s@%s would answer 404; an image's manifest is of its sha256 and size: check the size the cluster's catalog gives it",
				img.SHA256, img.ImageKey, served.OCI[img.SHA256].Manifest, strings.Join(wrong, ", "), osimage.OCIRepository(img.SHA256), wrong[0])
			continue
		case !entry.Available:
			img.State = osimage.StateNotAvailable
		default:
			img.State = osimage.StateServed
		}
		if err := served.Set.Require(img.SHA256, img.ImageKey); err != nil {
			img.Message = err.Error()
		}
		// The image server was asked to serve it for this namespace
		// (--serve-fleet-needs) and refused, or could not download it from
		// this namespace's record: say why, in its words.
		refusal, ok := served.Refused.For(namespace, img.SHA256)
		switch {
		case ok && img.State == osimage.StateNotServed && refusal.Reason != osimage.RefusedDownload:
			img.Message += "; the image server refuses to serve it for this namespace: " + refusal.Message
			img.Refused = refusal.Message
		case ok && img.State == osimage.StateNotAvailable && refusal.Reason == osimage.RefusedDownload:
			img.Message += "; " + refusal.Message
			img.Refused = refusal.Message
		}
	}
	if needErr != nil {
		for _, e := range splitJoined(needErr) {
			r.Errors = append(r.Errors, e.Error())
		}
	}
	return r
}

// unservedFilenames returns the filenames img asks for that the image
// server is known not to serve it under.
func unservedFilenames(files osimage.ServedFilenames, img osimage.ImageStatus) []string {
	var out []string
	for _, name := range img.Filenames {
		if served, known := files.Serves(img.SHA256, name); known && !served {
			out = append(out, name)
		}
	}
	return out
}

// unservedManifests returns the manifest digests img's oci:// URLs ask
// for that the image server is known not to serve it under (it publishes
// the one it serves once the image is available).
func unservedManifests(refs osimage.ServedOCI, img osimage.ImageStatus) []string {
	ref, known := refs[img.SHA256]
	if !known {
		return nil
	}
	var out []string
	for _, m := range img.Manifests {
		if m != ref.Manifest {
			out = append(out, m.String())
		}
	}
	return out
}

// filenameMessage keeps render's words (contract §9) and says which URL
// would answer 404 and why.
func filenameMessage(sha osimage.SHA256, key string, missing, servedAs []string) string {
	return fmt.Sprintf("image %s/%s is currently not served by mgmt cluster os-image-server under the filename %s: /images/%s/%s would answer 404 (the management os_images names this sha256 only as %s); give the image that filename in a key of the management os_images, or the management filename in the cluster's catalog",
		sha, key, strings.Join(missing, ", "), sha, missing[0], strings.Join(servedAs, ", "))
}

func splitJoined(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, splitJoined(e)...)
		}
		return out
	}
	return []error{err}
}
