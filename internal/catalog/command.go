package catalog

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/sylva-projects/osimages/internal/exitcode"
	"github.com/sylva-projects/osimages/internal/kube"
	"github.com/sylva-projects/osimages/internal/oci"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/signature"
	"github.com/sylva-projects/osimages/internal/values"
)

// Options are those of `osimages catalog`, as its flags give them. Errors
// name the flags.
type Options struct {
	ValueFiles []string
	Namespace  string
	// Filter is a regular expression of the image or registry keys to
	// resolve.
	Filter string
	// Apply writes the ConfigMap (server-side apply) instead of printing
	// it; Force resolves even when its inputs are unchanged, AllowEmpty
	// lets an empty catalog replace one that lists images.
	Apply, Force, AllowEmpty bool
	Kubeconfig               string
	Registry                 oci.Options
	Concurrency              int
	Timeout                  time.Duration
}

// Run resolves the catalog of o.ValueFiles and prints os-images-info to
// stdout, or applies it (o.Apply); what it does goes to stderr. A resolve
// that fails is an exitcode.FailureError, wrong values an
// exitcode.InputError.
func Run(ctx context.Context, o Options, stdout, stderr io.Writer) error {
	if o.Concurrency < 1 {
		return exitcode.InputError(fmt.Errorf("--concurrency must be at least 1"))
	}
	if o.Timeout <= 0 {
		return exitcode.InputError(fmt.Errorf("--timeout %s: give a positive duration, such as 60s", o.Timeout))
	}
	if err := kube.ValidateNamespace(o.Namespace); err != nil {
		return exitcode.InputError(fmt.Errorf("--namespace: %w", err))
	}
	filter, err := CompileFilter(o.Filter)
	if err != nil {
		return exitcode.InputError(err)
	}
	vals, err := values.LoadFiles(o.ValueFiles...)
	if err != nil {
		return exitcode.InputError(err)
	}
	plan, err := PlanFromValuesContext(ctx, vals, filter)
	if err != nil {
		if ctx.Err() != nil {
			return err
		}
		return exitcode.InputError(err)
	}
	hash := plan.InputsHash()

	var apply func(*corev1.ConfigMap) error
	if o.Apply {
		client, err := kube.Clientset(o.Kubeconfig)
		if err != nil {
			return exitcode.InputError(err)
		}
		key := kube.ObjectKey{Namespace: o.Namespace, Name: osimage.InfoConfigMapName}
		current, err := kube.GetConfigMap(ctx, client, key)
		if err != nil {
			return exitcode.FailureError(err)
		}
		if UpToDate(current, hash) && !o.Force {
			fmt.Fprintf(stderr, "ConfigMap %s is up to date (inputs %s); nothing to do (--force resolves again)\n", key, hash)
			return nil
		}
		// Every source resolves to one image or the run fails: an empty
		// plan is an empty catalog, refused before any registry request.
		if err := CheckEmptying(current, len(plan.Sources), o.AllowEmpty); err != nil {
			return exitcode.InputError(err)
		}
		apply = func(cm *corev1.ConfigMap) error {
			if _, err := kube.ApplyConfigMap(ctx, client, cm); err != nil {
				return err
			}
			fmt.Fprintf(stderr, "ConfigMap %s applied: %d images\n", key, len(plan.Sources))
			return nil
		}
	}

	client, err := oci.NewClient(oci.Options{
		Insecure:        plan.Insecure,
		CAFile:          o.Registry.CAFile,
		RegistryConfig:  o.Registry.RegistryConfig,
		MaxConnsPerHost: o.Concurrency,
	})
	if err != nil {
		return exitcode.InputError(err)
	}
	if plan.SkipSigningCheck && len(plan.KeyedRegistries) > 0 {
		fmt.Fprintf(stderr, "%s is true: cosign signatures are NOT checked (registries with a cosign_publickey: %s)\n",
			SkipPath, strings.Join(plan.KeyedRegistries, ", "))
	} else if unchecked := plan.Unchecked(); len(unchecked) > 0 && len(plan.KeyedRegistries) > 0 && !plan.RequireSignatures {
		// Say which images go unchecked, rather than let "signatures are
		// checked" be read as "every image is checked".
		fmt.Fprintf(stderr, "no cosign_publickey applies to %d OCI images, published without a signature check: %s (%s: true refuses them)\n",
			len(unchecked), strings.Join(unchecked, ", "), RequirePath)
	}
	resolved, err := Resolve(ctx, plan, client, ResolveOptions{
		Concurrency: o.Concurrency, Timeout: o.Timeout,
		Signatures: signature.Verifier{Client: client},
	})
	if err != nil {
		var report *ResolveError
		if errors.As(err, &report) {
			return exitcode.FailureError(err)
		}
		return err
	}
	cm, err := ConfigMap(o.Namespace, resolved, hash)
	var tooLarge *osimage.SizeError
	if errors.As(err, &tooLarge) {
		return exitcode.InputError(err)
	}
	if err != nil {
		return err
	}
	if len(resolved) == 0 {
		fmt.Fprintf(stderr, "warning: the values declare no image (os_images, sylva_diskimagebuilder_images%s): os-images-info is empty\n", filterNote(o.Filter))
	}
	if apply != nil {
		return exitcode.FailureError(apply(cm))
	}
	out, err := yaml.Marshal(cm)
	if err != nil {
		return err
	}
	_, err = stdout.Write(out)
	return err
}

func filterNote(filter string) string {
	if filter == "" {
		return ""
	}
	return fmt.Sprintf(", --filter %q", filter)
}
