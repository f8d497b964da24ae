package metal3

import (
	"context"
	"fmt"
	"slices"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// TemplateCRDName is the CustomResourceDefinition of Metal3MachineTemplates,
// whose schema tells whether the installed CAPM3 accepts an image without
// a checksum.
const TemplateCRDName = "metal3machinetemplates." + Group

// OCIDeliveryRelease is the first CAPM3 release that accepts a template
// whose image is an oci:// URL without a checksum. Up to v1.13.2 its
// schema requires image.checksum and its webhook answers "Image.Checksum:
// Required value: cannot be empty".
const OCIDeliveryRelease = "v1.14.0"

// OCIRefusedError says that the installed CAPM3 refuses a
// Metal3MachineTemplate whose image is given by oci:// (no checksum).
type OCIRefusedError struct {
	// Version is the Metal3MachineTemplate API version whose schema
	// requires the checksum.
	Version string
}

func (e *OCIRefusedError) Error() string {
	return fmt.Sprintf("the installed Cluster API Provider Metal3 requires spec.template.spec.image.checksum in %s/%s %s (CAPM3 before %s), and an oci:// image has none, so it refuses the template: upgrade CAPM3 to %s or later, or set image_delivery: http",
		Group, e.Version, KindMachineTemplate, OCIDeliveryRelease, OCIDeliveryRelease)
}

// OCIRefusal reads the Metal3MachineTemplate CRD's schema: it returns an
// *OCIRefusedError when spec.template.spec.image.checksum is required in
// one of versions (every served version when none is named), nil when the
// CRD accepts an image without it. It decides from the schema, the fact
// the apiserver enforces, not from a release number, which a CRD does not
// carry reliably. A version the CRD does not serve is not judged: the
// apiserver refuses it on its own terms.
func OCIRefusal(crd *apiextensionsv1.CustomResourceDefinition, versions ...string) error {
	for _, v := range crd.Spec.Versions {
		if !v.Served || (len(versions) > 0 && !slices.Contains(versions, v.Name)) {
			continue
		}
		if v.Schema == nil || v.Schema.OpenAPIV3Schema == nil {
			continue
		}
		image, ok := property(v.Schema.OpenAPIV3Schema, "spec", "template", "spec", "image")
		if ok && slices.Contains(image.Required, "checksum") {
			return &OCIRefusedError{Version: v.Name}
		}
	}
	return nil
}

// property walks a schema down the named properties.
func property(s *apiextensionsv1.JSONSchemaProps, path ...string) (*apiextensionsv1.JSONSchemaProps, bool) {
	for _, name := range path {
		next, ok := s.Properties[name]
		if !ok {
			return nil, false
		}
		s = &next
	}
	return s, true
}

// ReadOCIRefusal reads the Metal3MachineTemplate CRD through c and returns
// OCIRefusal of it: an *OCIRefusedError, or nil when the installed CAPM3
// accepts oci:// images or no CAPM3 is installed (nothing then holds a
// template to refuse). The second error is a failure to read the CRD.
func ReadOCIRefusal(ctx context.Context, c client.Reader, versions ...string) (refused, err error) {
	// Unstructured, so that any client reads it, whatever its scheme.
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(apiextensionsv1.SchemeGroupVersion.WithKind("CustomResourceDefinition"))
	if err := c.Get(ctx, types.NamespacedName{Name: TemplateCRDName}, u); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("reading CustomResourceDefinition %s, to learn whether the installed CAPM3 accepts oci:// images: %w", TemplateCRDName, err)
	}
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, crd); err != nil {
		return nil, fmt.Errorf("CustomResourceDefinition %s: %w", TemplateCRDName, err)
	}
	return OCIRefusal(crd, versions...), nil
}
