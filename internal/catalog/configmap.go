package catalog

import (
	"crypto/sha256"
	"encoding/hex"

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

// ConfigMap builds os-images-info (contract §3).
func ConfigMap(namespace string, c osimage.Catalog, inputsHash string) (*corev1.ConfigMap, error) {
	doc, err := osimage.MarshalInfo(c)
	if err != nil {
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
		Data: map[string]string{osimage.ValuesKey: string(doc)},
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
