// Package metal3 reads the Metal3 objects that point at served images:
// Metal3MachineTemplates (spec.template.spec.image) and Metal3Machines
// (spec.image). Metal3's Go modules are not used: only the two image
// fields are read, through unstructured objects, so that any served API
// version (v1beta1, v1beta2) is understood.
package metal3

import (
	"net/url"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/sylva-projects/osimages/internal/osimage"
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

// SHA256 is the sha256 of the image referenced, when it can be told: the
// checksum itself when it is a sha256, the sha256 in an osimages URL
// (/images/<sha256>/<filename>) given as the image URL or as the checksum
// (/images/<sha256>/<filename>.sha256sum, which Ironic fetches), or the
// repository of an osimages oci:// URL (oci://<host>/images/<sha256>@<manifest
// digest>, which carries no checksum). Each is
// read by the rules of osimage, the ones the image server serves by: a
// checksum in uppercase, or a path the server would not answer, names no
// image of osimages. An image given by hand with another checksum type and
// other URLs has none.
func (i Image) SHA256() (osimage.SHA256, bool) {
	if i.ChecksumType == "sha256" || i.ChecksumType == "" {
		if sha, err := osimage.ParseSHA256(i.Checksum); err == nil {
			return sha, true
		}
	}
	if ref, ok := osimage.ParseOCIReference(i.URL); ok {
		return ref.SHA256, true
	}
	for _, ref := range []string{i.URL, i.Checksum} {
		if u, err := url.Parse(ref); err == nil {
			if f, ok := osimage.ParseImagePath(u.EscapedPath()); ok {
				return f.SHA256, true
			}
		}
	}
	return "", false
}

// ServedFile is the sha256 and the filename of an osimages URL
// (/images/<sha256>/<filename>), and false for another URL: the file that
// Ironic will ask the image server for.
func (i Image) ServedFile() (sha osimage.SHA256, filename string, ok bool) {
	u, err := url.Parse(i.URL)
	if err != nil {
		return "", "", false
	}
	f, ok := osimage.ParseImagePath(u.EscapedPath())
	if !ok || f.Checksum != "" {
		return "", "", false
	}
	return f.SHA256, f.Filename, true
}

// Ref names an object that references an image, as NS/NAME with its kind.
type Ref struct {
	Kind, Namespace, Name string
}

func (r Ref) String() string { return r.Kind + " " + r.Namespace + "/" + r.Name }
