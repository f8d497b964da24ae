// Package kube reads and writes the objects osimages exchanges with a
// cluster: kubeconfig loading, and ConfigMaps applied with server-side apply
// so that osimages owns exactly the fields it writes.
package kube

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/validation"
	corev1ac "k8s.io/client-go/applyconfigurations/core/v1"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"
)

// FieldManager names osimages in managedFields.
const FieldManager = "osimages"

// RESTConfig loads a kubeconfig: the file given, else $KUBECONFIG or
// ~/.kube/config, else the in-cluster service account.
func RESTConfig(kubeconfig string) (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if kubeconfig != "" {
		rules.ExplicitPath = kubeconfig
	}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("loading kubeconfig: %w", err)
	}
	cfg.UserAgent = "osimages"
	return cfg, nil
}

// Clientset builds a typed client from a kubeconfig, as RESTConfig finds it.
func Clientset(kubeconfig string) (Client, error) {
	cfg, err := RESTConfig(kubeconfig)
	if err != nil {
		return nil, err
	}
	return NewClient(cfg)
}

// ObjectKey is a namespace/name pair as given on the command line.
type ObjectKey struct{ Namespace, Name string }

func (k ObjectKey) String() string { return k.Namespace + "/" + k.Name }

// ParseObjectKey reads NS/NAME, a namespace and an object name that the
// apiserver accepts.
func ParseObjectKey(s string) (ObjectKey, error) {
	ns, name, ok := strings.Cut(s, "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return ObjectKey{}, fmt.Errorf("%q: want NAMESPACE/NAME", s)
	}
	if err := ValidateNamespace(ns); err != nil {
		return ObjectKey{}, fmt.Errorf("%q: want NAMESPACE/NAME: %w", s, err)
	}
	if err := ValidateName(name); err != nil {
		return ObjectKey{}, fmt.Errorf("%q: want NAMESPACE/NAME: %w", s, err)
	}
	return ObjectKey{Namespace: ns, Name: name}, nil
}

// ValidateNamespace refuses what cannot name a namespace (a DNS-1123
// label), with the apiserver's own reasons.
func ValidateNamespace(ns string) error {
	if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
		return fmt.Errorf("namespace %q: %s", ns, strings.Join(errs, "; "))
	}
	return nil
}

// ValidateName refuses what cannot name a ConfigMap, a Lease or most
// other objects (a DNS-1123 subdomain), with the apiserver's own reasons.
func ValidateName(name string) error {
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return fmt.Errorf("name %q: %s", name, strings.Join(errs, "; "))
	}
	return nil
}

// GetConfigMap returns the ConfigMap, or nil when it does not exist.
func GetConfigMap(ctx context.Context, c Client, key ObjectKey) (*corev1.ConfigMap, error) {
	cm, err := c.CoreV1().ConfigMaps(key.Namespace).Get(ctx, key.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading ConfigMap %s: %w", key, err)
	}
	return cm, nil
}

// ConfigMapDocuments reads, in one read of a ConfigMap that must exist, its
// dataKey document, which must be there, and those of the optional keys it
// holds (absent from the map when it does not).
func ConfigMapDocuments(ctx context.Context, c Client, key ObjectKey, dataKey string, optional ...string) (map[string][]byte, error) {
	cm, err := GetConfigMap(ctx, c, key)
	if err != nil {
		return nil, err
	}
	if cm == nil {
		return nil, fmt.Errorf("ConfigMap %s not found", key)
	}
	data, ok := cm.Data[dataKey]
	if !ok {
		return nil, fmt.Errorf("ConfigMap %s has no data key %q", key, dataKey)
	}
	docs := map[string][]byte{dataKey: []byte(data)}
	for _, k := range optional {
		if doc, ok := cm.Data[k]; ok {
			docs[k] = []byte(doc)
		}
	}
	return docs, nil
}

// ApplyConfigMap writes cm with server-side apply, forcing ownership of the
// fields it sets: osimages is the one writer of its outputs.
func ApplyConfigMap(ctx context.Context, c Client, cm *corev1.ConfigMap) (*corev1.ConfigMap, error) {
	ac := corev1ac.ConfigMap(cm.Name, cm.Namespace).
		WithLabels(cm.Labels).
		WithAnnotations(cm.Annotations).
		WithData(cm.Data)
	out, err := c.CoreV1().ConfigMaps(cm.Namespace).Apply(ctx, ac, metav1.ApplyOptions{FieldManager: FieldManager, Force: true})
	if err != nil {
		return nil, fmt.Errorf("applying ConfigMap %s/%s: %w", cm.Namespace, cm.Name, err)
	}
	return out, nil
}

// ApplyObjects writes objs with server-side apply, all or nothing as far as
// the apiserver can tell in advance: every object is first applied as a
// dry run, so that a schema or admission refusal of any of them leaves the
// cluster untouched.
func ApplyObjects(ctx context.Context, cfg *rest.Config, objs []*unstructured.Unstructured) error {
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	disc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return err
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disc))
	resources := make([]dynamic.ResourceInterface, len(objs))
	for i, obj := range objs {
		gvk := obj.GroupVersionKind()
		mapping, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			return fmt.Errorf("%s %s: %w (is its CRD installed?)", gvk.Kind, obj.GetName(), err)
		}
		resources[i] = dyn.Resource(mapping.Resource).Namespace(obj.GetNamespace())
	}
	for _, dryRun := range [][]string{{metav1.DryRunAll}, nil} {
		for i, obj := range objs {
			opts := metav1.ApplyOptions{FieldManager: FieldManager, Force: true, DryRun: dryRun}
			if _, err := resources[i].Apply(ctx, obj.GetName(), obj, opts); err != nil {
				return fmt.Errorf("applying %s %s/%s: %w", obj.GetKind(), obj.GetNamespace(), obj.GetName(), err)
			}
		}
	}
	return nil
}

// Target is the cluster a command reads from or writes to.
type Target struct {
	Config *rest.Config
	Client Client
}

// NewTarget connects to the cluster of kubeconfig.
func NewTarget(kubeconfig string) (*Target, error) {
	cfg, err := RESTConfig(kubeconfig)
	if err != nil {
		return nil, err
	}
	client, err := NewClient(cfg)
	if err != nil {
		return nil, err
	}
	return &Target{Config: cfg, Client: client}, nil
}

// ConfigMapData reads the dataKey document of ConfigMap NS/NAME.
func (t *Target) ConfigMapData(ctx context.Context, nsName, dataKey string) ([]byte, error) {
	docs, err := t.ConfigMapDocuments(ctx, nsName, dataKey)
	return docs[dataKey], err
}

// ConfigMapDocuments is ConfigMapDocuments of ConfigMap NS/NAME.
func (t *Target) ConfigMapDocuments(ctx context.Context, nsName, dataKey string, optional ...string) (map[string][]byte, error) {
	key, err := ParseObjectKey(nsName)
	if err != nil {
		return nil, err
	}
	return ConfigMapDocuments(ctx, t.Client, key, dataKey, optional...)
}
