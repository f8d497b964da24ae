package controller

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/sylva-projects/osimages/internal/catalog"
	"github.com/sylva-projects/osimages/internal/fleet"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/values"
)

// CatalogOptions configure the per-namespace catalog.
type CatalogOptions struct {
	// Secure resolves manifests and verifies signatures; Insecure is used
	// when the values set oci_registry_insecure.
	Secure, Insecure Registry
	// Concurrency and Timeout are those of catalog.Resolve.
	Concurrency int
	Timeout     time.Duration
}

// Registry is how the catalog reads one kind of registry.
type Registry struct {
	Manifests catalog.ManifestFetcher
	// Signatures verifies cosign signatures; without it, an image whose
	// registry has a key fails (never published unverified).
	Signatures catalog.SignatureVerifier
}

const catalogFieldOwner = "osimages-catalog"

// cataloger publishes os-images-info in every namespace holding catalog
// inputs: the same resolution as `osimages catalog --apply`, driven by
// the labelled ConfigMaps instead of files.
type cataloger struct {
	opts     CatalogOptions
	reader   client.Reader
	writer   client.Client
	recorder events.EventRecorder
	metrics  *metrics
	log      logr.Logger
}

func (c *cataloger) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	name := req.Name
	var cms corev1.ConfigMapList
	if err := c.reader.List(ctx, &cms, client.InNamespace(name), client.HasLabels{fleet.CatalogValuesLabel}); err != nil {
		return reconcile.Result{}, err
	}
	if len(cms.Items) == 0 {
		return reconcile.Result{}, nil // os-images-info is left as it is: it may be Sylva's
	}
	// Several ConfigMaps merge in name order, later wins, like -f files.
	slices.SortFunc(cms.Items, func(a, b corev1.ConfigMap) int { return strings.Compare(a.Name, b.Name) })
	var vals values.Values
	var sources []string
	for _, cm := range cms.Items {
		source := "ConfigMap " + name + "/" + cm.Name
		sources = append(sources, source)
		v, err := values.Parse([]byte(cm.Data[osimage.ValuesKey]))
		if err == nil && cm.Data[osimage.ValuesKey] == "" {
			err = fmt.Errorf("no data key %s", osimage.ValuesKey)
		}
		if err != nil {
			return c.invalid(&cms.Items[0], fmt.Errorf("%s: %w", source, err))
		}
		vals = values.Merge(vals, v)
	}
	plan, err := catalog.PlanFromValues(vals, nil)
	if err != nil {
		return c.invalid(&cms.Items[0], fmt.Errorf("%s: %w", strings.Join(sources, ", "), err))
	}
	hash := plan.InputsHash()

	current := &corev1.ConfigMap{}
	key := types.NamespacedName{Namespace: name, Name: osimage.InfoConfigMapName}
	if err := c.reader.Get(ctx, key, current); err != nil {
		if !apierrors.IsNotFound(err) {
			return reconcile.Result{}, err
		}
		current = nil
	}
	if catalog.UpToDate(current, hash) {
		return reconcile.Result{}, nil
	}
	allowEmpty := slices.ContainsFunc(cms.Items, func(cm corev1.ConfigMap) bool { return cm.Annotations[catalog.AllowEmptyAnnotation] == "true" })
	if err := catalog.CheckEmptying(current, len(plan.Sources), allowEmpty); err != nil {
		return c.invalid(&cms.Items[0], err)
	}

	reg := c.opts.Secure
	if plan.Insecure {
		reg = c.opts.Insecure
	}
	if plan.SkipSigningCheck && len(plan.KeyedRegistries) > 0 {
		c.log.Info(catalog.SkipPath+" is true: cosign signatures are NOT checked", "namespace", name, "keyedRegistries", plan.KeyedRegistries)
	}
	resolved, err := catalog.Resolve(ctx, plan, reg.Manifests, catalog.ResolveOptions{
		Concurrency: c.opts.Concurrency, Timeout: c.opts.Timeout, Signatures: reg.Signatures,
	})
	if err != nil {
		c.metrics.catalogRun(name, false)
		c.event(&cms.Items[0], corev1.EventTypeWarning, "CatalogFailed", "os-images-info not updated: %v", err)
		// The registry may come back: retry with the controller's backoff.
		return reconcile.Result{}, fmt.Errorf("resolving the catalog of namespace %s: %w", name, err)
	}
	cm, err := catalog.ConfigMap(name, resolved, hash)
	if err != nil {
		// Too large for a ConfigMap: only new values can fix it.
		return c.invalid(&cms.Items[0], err)
	}
	if current == nil {
		err = c.writer.Create(ctx, cm, client.FieldOwner(catalogFieldOwner))
	} else {
		updated := current.DeepCopy()
		updated.Data = cm.Data
		if updated.Labels == nil {
			updated.Labels = map[string]string{}
		}
		if updated.Annotations == nil {
			updated.Annotations = map[string]string{}
		}
		maps.Copy(updated.Labels, cm.Labels)
		maps.Copy(updated.Annotations, cm.Annotations)
		err = c.writer.Update(ctx, updated, client.FieldOwner(catalogFieldOwner))
	}
	if err != nil {
		return reconcile.Result{}, fmt.Errorf("writing ConfigMap %s: %w", key, err)
	}
	c.metrics.catalogRun(name, true)
	c.log.Info("catalog published", "namespace", name, "images", len(resolved), "inputsHash", hash)
	c.event(&cms.Items[0], corev1.EventTypeNormal, "CatalogPublished", "os-images-info published: %d images", len(resolved))
	return reconcile.Result{}, nil
}

// invalid reports values that no retry can fix: the next change of the
// ConfigMaps triggers a new attempt.
func (c *cataloger) invalid(input *corev1.ConfigMap, err error) (reconcile.Result, error) {
	c.metrics.catalogRun(input.Namespace, false)
	c.log.Error(err, "catalog inputs are wrong; fix them, os-images-info is left as it is", "namespace", input.Namespace)
	c.event(input, corev1.EventTypeWarning, "CatalogValuesInvalid", "%v", err)
	return reconcile.Result{}, nil
}

// event regards the (first) catalog-values ConfigMap: it is what the
// operator edits, and it lives in the namespace concerned.
func (c *cataloger) event(input *corev1.ConfigMap, kind, reason, format string, args ...any) {
	c.recorder.Eventf(input, nil, kind, reason, "Catalog", format, args...)
}
