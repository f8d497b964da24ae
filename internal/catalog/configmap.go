package catalog

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sylva-projects/osimages/internal/osimage"
)

// InputsHashAnnotation records Plan.InputsHash on the published ConfigMap,
// so that a run with unchanged inputs can skip the registries entirely.
const InputsHashAnnotation = "osimages.sylva-project.org/inputs-hash"

// DataHashAnnotation records the sha256 of the published document, so that
// the skip of an unchanged input also checks that the data is still what
// was published: a hand edit that keeps the annotations is repaired.
const DataHashAnnotation = "osimages.sylva-project.org/data-hash"

// DefaultNamespace is where the management cluster's catalog lives.
const DefaultNamespace = "sylva-system"

// ConfigMap builds os-images-info (contract §3). A catalog too large for
// a ConfigMap is refused with an osimage.SizeError, before anything is
// written.
func ConfigMap(namespace string, c osimage.Catalog, inputsHash string) (*corev1.ConfigMap, error) {
	doc, err := osimage.MarshalInfo(c)
	if err != nil {
		return nil, err
	}
	data := map[string]string{osimage.ValuesKey: string(doc)}
	if err := osimage.CheckConfigMapSize("ConfigMap "+namespace+"/"+osimage.InfoConfigMapName, data, len(c)); err != nil {
		return nil, err
	}
	return &corev1.ConfigMap{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{
			Name:        osimage.InfoConfigMapName,
			Namespace:   namespace,
			Labels:      map[string]string{osimage.InfoLabel: ""},
			Annotations: map[string]string{InputsHashAnnotation: inputsHash, DataHashAnnotation: DataHash(string(doc))},
		},
		Data: data,
	}, nil
}

// UpToDate says whether cm was published from inputs with this hash and
// still holds the data then published.
func UpToDate(cm *corev1.ConfigMap, inputsHash string) bool {
	return cm != nil && cm.Annotations[InputsHashAnnotation] == inputsHash &&
		cm.Annotations[DataHashAnnotation] == DataHash(cm.Data[osimage.ValuesKey])
}

// DataHash is the value of DataHashAnnotation for a document.
func DataHash(doc string) string {
	sum := sha256.Sum256([]byte(doc))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// AllowEmptyAnnotation, "true" on a catalog-values ConfigMap, lets the
// controller empty the namespace's os-images-info on purpose.
const AllowEmptyAnnotation = "osimages.sylva-project.org/allow-empty"

// EmptyingError refuses to replace an os-images-info that lists images with
// an empty one: values whose relevant keys were lost (an emptied file, a
// misspelt key) would otherwise wipe the catalog of a whole cluster.
type EmptyingError struct {
	// ConfigMap names the os-images-info in place; Images counts its images.
	ConfigMap string
	Images    int
}

func (e *EmptyingError) Error() string {
	return fmt.Sprintf("the values give an empty catalog, and ConfigMap %s lists %d images: not replaced. Check that the values still declare the images (os_images, sylva_diskimagebuilder_images, --filter); to empty it on purpose, pass --allow-empty to osimages catalog, or annotate the catalog-values ConfigMap %s=true for the controller",
		e.ConfigMap, e.Images, AllowEmptyAnnotation)
}

// CheckEmptying refuses, with an EmptyingError, to replace current (nil
// when absent) by a catalog of images images when that empties it, unless
// allowEmpty. A current document that does not parse lists nothing.
func CheckEmptying(current *corev1.ConfigMap, images int, allowEmpty bool) error {
	if current == nil || images > 0 || allowEmpty {
		return nil
	}
	cat, err := osimage.ParseInfo([]byte(current.Data[osimage.ValuesKey]))
	if err != nil || len(cat) == 0 {
		return nil
	}
	return &EmptyingError{ConfigMap: current.Namespace + "/" + current.Name, Images: len(cat)}
}
