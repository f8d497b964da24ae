package fleet

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/sylva-projects/osimages/internal/capm3"
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
	SHA256   string   `json:"sha256"`
	ImageKey string   `json:"imageKey,omitempty"`
	State    State    `json:"state"`
	NeededBy []string `json:"neededBy"`
	// Message is render's error for this image, when it is not served.
	Message string `json:"message,omitempty"`
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

// Check compares what a namespace needs with the served set it holds.
func Check(namespace, servedSetName string, needs []Need, served osimage.ServedSet, servedFound bool, needErr error) Report {
	r := Report{Namespace: namespace, ServedSet: servedSetName, ServedSetFound: servedFound, Images: group(needs)}
	for i := range r.Images {
		img := &r.Images[i]
		entry, ok := served[img.SHA256]
		switch {
		case !ok:
			img.State = StateNotServed
		case !entry.Available:
			img.State = StateNotAvailable
		default:
			img.State = StateServed
		}
		if err := capm3.CheckServed(served, img.SHA256, img.ImageKey); err != nil {
			img.Message = err.Error()
		}
	}
	if needErr != nil {
		for _, e := range splitJoined(needErr) {
			r.Errors = append(r.Errors, e.Error())
		}
	}
	return r
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

// ParseStatus reads a status document back.
func ParseStatus(data string) (Report, error) {
	var r Report
	err := yaml.UnmarshalStrict([]byte(data), &r)
	return r, err
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
