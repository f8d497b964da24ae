package osimage

import "fmt"

// MaxConfigMapBytes is the apiserver's bound on a ConfigMap: the values of
// its data and binaryData together (corev1.MaxSecretSize, which
// ValidateConfigMap applies to ConfigMaps too). os-images-info passes it at
// about 1,600 images (some 650 bytes each), the served set at a few
// thousand.
const MaxConfigMapBytes = 1 << 20

// SizeError is an output that a ConfigMap cannot hold. It names what would
// be written, its size and how many images it holds, so that the operator
// sees the cause before the apiserver refuses it.
type SizeError struct {
	// What names the output, such as "ConfigMap sylva-system/os-images-info".
	What   string
	Bytes  int
	Images int
}

func (e *SizeError) Error() string {
	return fmt.Sprintf("%s would hold %d bytes (%.2f MiB) for %d images, over the %d bytes (1 MiB) a ConfigMap can hold; nothing was written: select or declare fewer images (catalog: --filter, or split the values; server: narrower selectors)",
		e.What, e.Bytes, float64(e.Bytes)/(1<<20), e.Images, MaxConfigMapBytes)
}

// ConfigMapBytes counts the bytes of data as the apiserver does: the
// values, not the keys.
func ConfigMapBytes(data map[string]string) int {
	n := 0
	for _, v := range data {
		n += len(v)
	}
	return n
}

// CheckConfigMapSize refuses, with a SizeError, ConfigMap data that the
// apiserver would refuse for its size. It is the one check the catalog,
// the image server and the controller make before they write.
func CheckConfigMapSize(what string, data map[string]string, images int) error {
	if n := ConfigMapBytes(data); n > MaxConfigMapBytes {
		return &SizeError{What: what, Bytes: n, Images: images}
	}
	return nil
}
