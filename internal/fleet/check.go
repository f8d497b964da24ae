package fleet

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/opencontainers/go-digest"
	"github.com/sylva-projects/osimages/internal/osimage"
)

// State is where a needed image stands in the management cluster.
type State string

// The states of a needed image.
const (
	StateServed       State = "served"
	StateNotAvailable State = "not-available"
	StateNotServed    State = "not-served"
)

// ImageStatus is one needed image and its state.
type ImageStatus struct {
	SHA256   osimage.SHA256 `json:"sha256"`
	ImageKey string         `json:"imageKey,omitempty"`
	// Filenames are those its URLs ask for (/images/<sha256>/<filename>).
	Filenames []string `json:"filenames,omitempty"`
	// Manifests are the manifest digests its oci:// URLs ask for
	// (oci://<host>/images/<sha256>@<manifest>).
	Manifests []digest.Digest `json:"manifests,omitempty"`
	State     State           `json:"state"`
	NeededBy  []string        `json:"neededBy"`
	// Message is render's error for this image, when it is not served.
	Message string `json:"message,omitempty"`
	// Refused is why the image server refuses to serve it for this
	// namespace (serve --serve-fleet-needs), when it does.
	Refused string `json:"refused,omitempty"`
}

// Report is the state of one workload-cluster namespace.
type Report struct {
	Namespace string `json:"namespace"`
	// ServedSet names the copy of the served set checked against.
	ServedSet string `json:"servedSet"`
	// ServedSetFound is false when the copy is missing: every image is
	// then not served, as render would say.
	ServedSetFound bool          `json:"servedSetFound"`
	Images         []ImageStatus `json:"images"`
	// Errors are what could not be worked out from the cluster's inputs.
	Errors []string `json:"errors,omitempty"`
}

// Check compares what a namespace needs with the served set it holds. An
// image of the set that is not served under a filename its URLs ask for
// is not served: that URL answers 404, whatever the set says. When the
// copy carries no filenames (a server that does not publish them), only
// the sha256 is compared.
func Check(namespace, servedSetName string, needs []Need, served osimage.ServedOutput, servedFound bool, needErr error) Report {
	r := Report{Namespace: namespace, ServedSet: servedSetName, ServedSetFound: servedFound, Images: group(needs)}
	for i := range r.Images {
		img := &r.Images[i]
		entry, ok := served.Set[img.SHA256]
		missing := unservedFilenames(served.Filenames, *img)
		wrong := unservedManifests(served.OCI, *img)
		switch {
		case !ok:
			img.State = StateNotServed
		case len(missing) > 0:
			img.State = StateNotServed
			img.Message = filenameMessage(img.SHA256, img.ImageKey, missing, served.Filenames[img.SHA256])
			continue
		case len(wrong) > 0:
			img.State = StateNotServed
			img.Message = fmt.Sprintf("image %s/%s is served through oci:// under manifest %s, not %s: oci://<host>/%s@%s would answer 404; an image's manifest is of its sha256 and size: check the size the cluster's catalog gives it",
				img.SHA256, img.ImageKey, served.OCI[img.SHA256].Manifest, joinDigests(wrong), osimage.OCIRepository(img.SHA256), wrong[0])
			continue
		case !entry.Available:
			img.State = StateNotAvailable
		default:
			img.State = StateServed
		}
		if err := served.Set.Require(img.SHA256, img.ImageKey); err != nil {
			img.Message = err.Error()
		}
		// The image server was asked to serve it for this namespace
		// (--serve-fleet-needs) and refused, or could not download it from
		// this namespace's record: say why, in its words.
		refusal, ok := served.Refused.For(namespace, img.SHA256)
		switch {
		case ok && img.State == StateNotServed && refusal.Reason != osimage.RefusedDownload:
			img.Message += "; the image server refuses to serve it for this namespace: " + refusal.Message
			img.Refused = refusal.Message
		case ok && img.State == StateNotAvailable && refusal.Reason == osimage.RefusedDownload:
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
func unservedFilenames(files osimage.ServedFilenames, img ImageStatus) []string {
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
func unservedManifests(refs osimage.ServedOCI, img ImageStatus) []digest.Digest {
	ref, known := refs[img.SHA256]
	if !known {
		return nil
	}
	var out []digest.Digest
	for _, m := range img.Manifests {
		if m != ref.Manifest {
			out = append(out, m)
		}
	}
	return out
}

func joinDigests(ds []digest.Digest) string {
	s := make([]string, len(ds))
	for i, d := range ds {
		s[i] = d.String()
	}
	return strings.Join(s, ", ")
}

// filenameMessage keeps render's words (contract §9) and says which URL
// would answer 404 and why.
func filenameMessage(sha osimage.SHA256, key string, missing, servedAs []string) string {
	return fmt.Sprintf("image %s/%s is currently not served by mgmt cluster os-image-server under the filename %s: /images/%s/%s would answer 404 (the management os_images names this sha256 only as %s); give the image that filename in a key of the management os_images, or the management filename in the cluster's catalog",
		sha, key, strings.Join(missing, ", "), sha, missing[0], strings.Join(servedAs, ", "))
}

// Problems returns the images that are needed and not served or not
// available.
func (r Report) Problems() []ImageStatus {
	var out []ImageStatus
	for _, img := range r.Images {
		if img.State != StateServed {
			out = append(out, img)
		}
	}
	return out
}

// Count returns how many needed images are in state s.
func (r Report) Count(s State) int {
	n := 0
	for _, img := range r.Images {
		if img.State == s {
			n++
		}
	}
	return n
}

// Summary is one line for logs and events.
func (r Report) Summary() string {
	return fmt.Sprintf("%d images needed: %d served, %d not available yet, %d not served; %d input problems",
		len(r.Images), r.Count(StateServed), r.Count(StateNotAvailable), r.Count(StateNotServed), len(r.Errors))
}

// StatusConfigMapName is the summary ConfigMap written in each checked
// namespace.
const StatusConfigMapName = "osimages-status"

// StatusKey is the data key of the status document.
const StatusKey = "status.yaml"

// StatusLabel marks the status ConfigMaps.
const StatusLabel = "osimages.sylva-project.org/status"

// ConfigMap is the status ConfigMap of the report.
func (r Report) ConfigMap() (*corev1.ConfigMap, error) {
	doc, err := yaml.Marshal(r)
	if err != nil {
		return nil, err
	}
	return &corev1.ConfigMap{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{
			Name: StatusConfigMapName, Namespace: r.Namespace,
			Labels: map[string]string{StatusLabel: ""},
		},
		Data: map[string]string{StatusKey: string(doc)},
	}, nil
}

// ParseStatus reads a status document back. An image whose sha256 is not
// one (a status written by hand) is left out: it names no image.
func ParseStatus(data string) (Report, error) {
	var r Report
	if err := yaml.UnmarshalStrict([]byte(data), &r); err != nil {
		return r, err
	}
	images := r.Images[:0]
	for _, img := range r.Images {
		sha, err := osimage.ParseSHA256(string(img.SHA256))
		if err != nil {
			continue
		}
		img.SHA256 = sha
		images = append(images, img)
	}
	r.Images = images
	return r, nil
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
