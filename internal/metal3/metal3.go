// Package metal3 reads the Metal3 objects that point at served images:
// Metal3MachineTemplates (spec.template.spec.image) and Metal3Machines
// (spec.image). Metal3's Go modules are not used: only the two image
// fields are read, through unstructured objects, so that any served API
// version (v1beta1, v1beta2) is understood.
package metal3

import (
	"net/url"
	"regexp"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// Group is the API group of the Metal3 infrastructure provider.
const Group = "infrastructure.cluster.x-k8s.io"

// The kinds that reference images.
const (
	KindMachineTemplate = "Metal3MachineTemplate"
	KindMachine         = "Metal3Machine"
)

// resources maps the resources that reference images to their kinds: a
// reference held by either keeps an image alive (a MachineSet creates
// Metal3Machines from the template, and nodeReuse needs the template).
var resources = map[string]string{
	"metal3machinetemplates": KindMachineTemplate,
	"metal3machines":         KindMachine,
}

// Image is the image an object references.
type Image struct {
	URL, Checksum, ChecksumType string
}

// ImageOf returns the image block of a Metal3MachineTemplate or a
// Metal3Machine, and false when it has none.
func ImageOf(obj *unstructured.Unstructured) (Image, bool) {
	path := []string{"spec", "image"}
	if obj.GetKind() == KindMachineTemplate {
		path = []string{"spec", "template", "spec", "image"}
	}
	m, ok, _ := unstructured.NestedStringMap(obj.Object, path...)
	if !ok {
		return Image{}, false
	}
	return Image{URL: m["url"], Checksum: m["checksum"], ChecksumType: m["checksumType"]}, m["url"] != "" || m["checksum"] != ""
}

var (
	sha256Hex = regexp.MustCompile(`^[0-9a-f]{64}$`)
	// servedPath is where osimages (contract §5) serves an image, and its
	// checksum files beside it.
	servedPath = regexp.MustCompile(`/images/([0-9a-f]{64})/([^/]+)$`)
)

// SHA256 is the sha256 of the image referenced, when it can be told: the
// checksum itself when it is a sha256, or the sha256 in an osimages URL
// (/images/<sha256>/<filename>) given as the image URL or as the checksum
// (/images/<sha256>/<filename>.sha256sum, which Ironic fetches). An image
// given by hand with another checksum type and other URLs has none.
func (i Image) SHA256() (string, bool) {
	if (i.ChecksumType == "sha256" || i.ChecksumType == "") && sha256Hex.MatchString(strings.ToLower(i.Checksum)) {
		return strings.ToLower(i.Checksum), true
	}
	for _, ref := range []string{i.URL, i.Checksum} {
		if u, err := url.Parse(ref); err == nil {
			if m := servedPath.FindStringSubmatch(u.Path); m != nil {
				return m[1], true
			}
		}
	}
	return "", false
}

// ServedFile is the sha256 and the filename of an osimages URL
// (/images/<sha256>/<filename>), and false for another URL: the file that
// Ironic will ask the image server for.
func (i Image) ServedFile() (sha, filename string, ok bool) {
	u, err := url.Parse(i.URL)
	if err != nil {
		return "", "", false
	}
	m := servedPath.FindStringSubmatch(u.Path)
	if m == nil {
		return "", "", false
	}
	return m[1], m[2], true
}

// Ref names an object that references an image, as NS/NAME with its kind.
type Ref struct {
	Kind, Namespace, Name string
}

func (r Ref) String() string { return r.Kind + " " + r.Namespace + "/" + r.Name }
