package controller

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"
	"sigs.k8s.io/yaml"

	"github.com/sylva-projects/osimages/internal/catalog"
	"github.com/sylva-projects/osimages/internal/fleet"
	"github.com/sylva-projects/osimages/internal/kube"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/values"
)

// CatalogOptions configure the per-namespace catalog.
type CatalogOptions struct {
	// Secure resolves manifests and verifies signatures; Insecure is used
	// when the values set oci_registry_insecure.
	Secure, Insecure Registry
	// Concurrency is the number of manifests one namespace fetches at once
	// (default 8); Timeout bounds one image, retries included (default
	// 60s).
	Concurrency int
	Timeout     time.Duration
	// RunTimeout is the budget of one namespace's run (default 5m): a run
	// still going after it is stopped, reported, and retried with backoff.
	RunTimeout time.Duration
	// Slots bounds the registry requests of all namespaces at once
	// (default Options.Workers × Concurrency), shared fairly (fairSlots).
	Slots int
	// RetryBase and RetryMax bound the backoff after a failed run (default
	// 10s doubling to 10m). A change of the inputs retries at once.
	RetryBase, RetryMax time.Duration
	// MaxInputSize bounds the data of a namespace's catalog-values
	// ConfigMaps (DefaultMaxInputSize when 0).
	MaxInputSize int
	// Registries are those a namespace's catalog may reach; a plan that
	// names another is refused before any connection. Nil allows any.
	Registries *catalog.RegistryAllowlist
}

func (o CatalogOptions) withDefaults(workers int) CatalogOptions {
	if o.Concurrency <= 0 {
		o.Concurrency = 8
	}
	if o.Timeout <= 0 {
		o.Timeout = 60 * time.Second
	}
	if o.RunTimeout <= 0 {
		o.RunTimeout = 5 * time.Minute
	}
	if o.Slots <= 0 {
		o.Slots = max(workers, 1) * o.Concurrency
	}
	if o.RetryBase <= 0 {
		o.RetryBase = 10 * time.Second
	}
	if o.RetryMax <= 0 {
		o.RetryMax = 10 * time.Minute
	}
	if o.MaxInputSize <= 0 {
		o.MaxInputSize = DefaultMaxInputSize
	}
	return o
}

// Registry is how the catalog reads one kind of registry.
type Registry struct {
	Manifests catalog.ManifestFetcher
	// Signatures verifies cosign signatures; without it, an image whose
	// registry has a key fails (never published unverified).
	Signatures catalog.SignatureVerifier
}

const (
	catalogFieldOwner  = "osimages-catalog"
	eventActionCatalog = "Catalog"
	// planTimeout bounds reading a namespace's values into a plan; the
	// bounds of template expansion keep it far below.
	planTimeout = 10 * time.Second
)

func sameCatalogStatus(s, o osimage.CatalogStatus) bool {
	return s.State == o.State && s.InputsHash == o.InputsHash && s.Message == o.Message && s.Images == o.Images
}

// The causes that end a run early.
var (
	errRunBudget     = errors.New("the run passed its time budget")
	errInputsChanged = errors.New("its inputs changed")
	errInputsGone    = errors.New("its inputs are gone")
	errStopping      = errors.New("the controller is stopping")
	errUpToDate      = errors.New("os-images-info is already up to date")
)

// catalogReconciler publishes os-images-info in every namespace holding catalog
// inputs: the same resolution as `osimages catalog --apply`, driven by the
// labelled ConfigMaps instead of files. The registry work of a namespace
// is a run in the background, so that a reconcile only reads, plans and
// writes: a namespace whose registry never answers holds no worker, and
// its run has a time budget, a deadline per image, its share of the
// registry slots, and is cancelled as soon as its inputs change or go.
type catalogReconciler struct {
	opts     CatalogOptions
	reader   client.Reader
	writer   client.Client
	recorder events.EventRecorder
	metrics  *metrics
	log      logr.Logger
	slots    *fairSlots
	now      func() time.Time
	// wake requeues a namespace whose run ended.
	wake chan event.GenericEvent

	mu   sync.Mutex
	runs map[string]*catalogRun
	// refused holds the last refusal of each namespace's inputs, so that
	// it is announced once.
	refused map[string]string
	stopped bool
	base    context.Context
	stop    context.CancelCauseFunc
	wg      sync.WaitGroup
}

// catalogRun is the resolution of one namespace's plan.
type catalogRun struct {
	hash    string
	cancel  context.CancelCauseFunc
	started time.Time
	// attempt counts the failed runs of this hash before this one.
	attempt int
	// Set when the run ends (under catalogReconciler.mu).
	done     bool
	result   osimage.Catalog
	err      error
	retryAt  time.Time
	reported bool
}

func newCatalogReconciler(opts CatalogOptions, workers int, m *metrics) *catalogReconciler {
	opts = opts.withDefaults(workers)
	c := &catalogReconciler{opts: opts, metrics: m, now: time.Now, wake: make(chan event.GenericEvent, 1024), runs: map[string]*catalogRun{}, refused: map[string]string{}}
	c.base, c.stop = context.WithCancelCause(context.Background())
	c.slots = newFairSlots(opts.Slots, func(ns string) { m.preemptions.WithLabelValues(ns).Inc() })
	m.running = c.runningSince
	return c
}

// SetupWithManager watches the catalog inputs and os-images-info, and the
// ends of the runs; the reconciler is a runnable of mgr too, so that the
// runs stop with it.
func (c *catalogReconciler) SetupWithManager(mgr manager.Manager, options controller.Options) error {
	c.reader, c.writer = mgr.GetCache(), mgr.GetClient()
	c.recorder = kube.BoundedEvents(mgr.GetEventRecorder(eventSource))
	c.log = mgr.GetLogger().WithValues("controller", "catalog")
	if err := mgr.Add(c); err != nil {
		return err
	}
	inputs := func(ctx context.Context, obj client.Object) []reconcile.Request {
		if _, ok := obj.GetLabels()[fleet.CatalogValuesLabel]; ok || obj.GetName() == osimage.InfoConfigMapName {
			return toNamespace(ctx, obj)
		}
		return nil
	}
	err := builder.ControllerManagedBy(mgr).Named("catalog").WithOptions(options).
		Watches(&corev1.ConfigMap{}, handler.EnqueueRequestsFromMapFunc(inputs)).
		WatchesRawSource(source.Channel(c.wake, handler.EnqueueRequestsFromMapFunc(toNamespace))).
		Complete(c)
	if err != nil {
		return fmt.Errorf("creating the catalog controller: %w", err)
	}
	return nil
}

// Start waits for the manager to stop, then stops every run: it makes the
// reconciler a manager.Runnable, elected with the controllers.
func (c *catalogReconciler) Start(ctx context.Context) error {
	<-ctx.Done()
	c.mu.Lock()
	c.stopped = true
	c.mu.Unlock()
	c.stop(errStopping)
	c.wg.Wait()
	return nil
}

func (c *catalogReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	name := req.Name
	var cms corev1.ConfigMapList
	if err := c.reader.List(ctx, &cms, client.InNamespace(name), client.HasLabels{fleet.CatalogValuesLabel}); err != nil {
		return reconcile.Result{}, err
	}
	if len(cms.Items) == 0 {
		// os-images-info is left as it is: it may be Sylva's.
		c.cancelRun(name, "", errInputsGone)
		c.mu.Lock()
		delete(c.refused, name)
		c.mu.Unlock()
		c.metrics.forgetCatalog(name)
		return reconcile.Result{}, nil
	}
	// Several ConfigMaps merge in name order, later wins, like -f files.
	slices.SortFunc(cms.Items, func(a, b corev1.ConfigMap) int { return strings.Compare(a.Name, b.Name) })
	input := &cms.Items[0]
	inputs, err := checkInputSizes(cms.Items, fleet.CatalogValuesLabel, c.opts.MaxInputSize)
	if err != nil {
		return c.refuse(ctx, input, reasonInputTooLarge, err)
	}
	var vals values.Values
	var sources []string
	for _, cm := range inputs {
		source := "ConfigMap " + name + "/" + cm.Name
		sources = append(sources, source)
		v, err := values.Parse([]byte(cm.Data[osimage.ValuesKey]))
		if err == nil && cm.Data[osimage.ValuesKey] == "" {
			err = fmt.Errorf("no data key %s", osimage.ValuesKey)
		}
		if err != nil {
			return c.refuse(ctx, input, reasonValuesInvalid, fmt.Errorf("%s: %w", source, err))
		}
		vals = values.Merge(vals, v)
	}
	pctx, cancel := context.WithTimeoutCause(ctx, planTimeout, fmt.Errorf("reading the values took more than %s", planTimeout))
	plan, err := catalog.PlanFromValuesContext(pctx, vals, nil)
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return reconcile.Result{}, err
		}
		return c.refuse(ctx, input, reasonValuesInvalid, fmt.Errorf("%s: %w", strings.Join(sources, ", "), err))
	}
	if err := c.opts.Registries.Admit(plan); err != nil {
		return c.refuse(ctx, input, reasonRegistryNotAllowed, fmt.Errorf("%s: %w", strings.Join(sources, ", "), err))
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
		c.cancelRun(name, "", errUpToDate)
		c.mu.Lock()
		delete(c.refused, name)
		c.mu.Unlock()
		c.metrics.catalogState(name, osimage.CatalogPublished)
		return c.setStatus(ctx, input, osimage.CatalogStatus{State: osimage.CatalogPublished, InputsHash: hash, Images: countImages(current)})
	}
	allowEmpty := slices.ContainsFunc(inputs, func(cm corev1.ConfigMap) bool { return cm.Annotations[catalog.AllowEmptyAnnotation] == "true" })
	if err := catalog.CheckEmptying(current, len(plan.Sources), allowEmpty); err != nil {
		return c.refuse(ctx, input, reasonValuesInvalid, err)
	}
	return c.advance(ctx, input, plan, hash, current)
}

// advance moves the namespace's run for hash one step: start it, wait for
// it, publish its result, or report its failure and retry it after a
// backoff.
func (c *catalogReconciler) advance(ctx context.Context, input *corev1.ConfigMap, plan catalog.Plan, hash string, current *corev1.ConfigMap) (reconcile.Result, error) {
	name := input.Namespace
	c.cancelRun(name, hash, errInputsChanged)
	c.mu.Lock()
	delete(c.refused, name)
	r := c.runs[name]
	switch {
	case r == nil:
		r = c.start(name, plan, hash, 0)
		c.mu.Unlock()
		return c.setStatus(ctx, input, osimage.CatalogStatus{State: osimage.CatalogRunning, InputsHash: hash, Message: fmt.Sprintf("resolving %d images", len(plan.Sources))})
	case !r.done:
		c.mu.Unlock()
		return reconcile.Result{}, nil // its end wakes the namespace
	case r.err == nil:
		result := r.result
		c.mu.Unlock()
		return c.publish(ctx, input, plan, hash, current, r, result)
	case !r.reported:
		r.reported = true
		wait := c.backoff(r.attempt)
		r.retryAt = c.now().Add(wait)
		err := r.err
		c.mu.Unlock()
		res, statusErr := c.failed(ctx, input, hash, err, wait)
		if statusErr == nil && res.RequeueAfter == 0 {
			res.RequeueAfter = wait
		}
		return res, statusErr
	case c.now().Before(r.retryAt):
		wait := r.retryAt.Sub(c.now())
		c.mu.Unlock()
		return reconcile.Result{RequeueAfter: wait}, nil
	default:
		c.start(name, plan, hash, r.attempt+1)
		c.mu.Unlock()
		return c.setStatus(ctx, input, osimage.CatalogStatus{State: osimage.CatalogRunning, InputsHash: hash, Message: fmt.Sprintf("resolving %d images (attempt %d)", len(plan.Sources), r.attempt+2)})
	}
}

// start begins a run (called locked).
func (c *catalogReconciler) start(namespace string, plan catalog.Plan, hash string, attempt int) *catalogRun {
	ctx, cancel := context.WithCancelCause(c.base)
	r := &catalogRun{hash: hash, cancel: cancel, started: c.now(), attempt: attempt}
	c.runs[namespace] = r
	if c.stopped {
		cancel(errStopping)
		r.done, r.err = true, errStopping
		return r
	}
	reg := c.opts.Secure
	if plan.Insecure {
		reg = c.opts.Insecure
	}
	if plan.SkipSigningCheck && len(plan.KeyedRegistries) > 0 {
		c.log.Info(catalog.SkipPath+" is true: cosign signatures are NOT checked", "namespace", namespace, "keyedRegistries", plan.KeyedRegistries)
	}
	opts := catalog.ResolveOptions{Concurrency: c.opts.Concurrency, Timeout: c.opts.Timeout}
	if reg.Signatures != nil {
		opts.Signatures = slotVerifier{slots: c.slots, namespace: namespace, inner: reg.Signatures}
	}
	fetcher := slotFetcher{slots: c.slots, namespace: namespace, inner: reg.Manifests}
	c.metrics.catalogState(namespace, osimage.CatalogRunning)
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		rctx, stop := context.WithTimeoutCause(ctx, c.opts.RunTimeout, errRunBudget)
		resolved, err := catalog.Resolve(rctx, plan, fetcher, opts)
		stop()
		cause := context.Cause(ctx)
		c.mu.Lock()
		r.done, r.result, r.err = true, resolved, err
		c.mu.Unlock()
		cancel(nil)
		if cause != nil {
			return // cancelled: the run is no longer wanted
		}
		select {
		case c.wake <- event.GenericEvent{Object: &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}}:
		case <-c.base.Done():
		}
	}()
	return r
}

// cancelRun stops the namespace's run unless it resolves keep.
func (c *catalogReconciler) cancelRun(namespace, keep string, why error) {
	c.mu.Lock()
	r := c.runs[namespace]
	if r == nil || r.hash == keep {
		c.mu.Unlock()
		return
	}
	delete(c.runs, namespace)
	running := !r.done
	c.mu.Unlock()
	r.cancel(why)
	if running {
		c.metrics.catalogRun(namespace, "cancelled")
		c.log.Info("catalog run cancelled", "namespace", namespace, "reason", why.Error(), "after", c.now().Sub(r.started).Round(time.Millisecond).String())
	}
}

func (c *catalogReconciler) backoff(attempt int) time.Duration {
	d := c.opts.RetryBase
	for range attempt {
		d *= 2
		if d >= c.opts.RetryMax {
			return c.opts.RetryMax
		}
	}
	return d
}

// publish writes os-images-info from a run's result.
func (c *catalogReconciler) publish(ctx context.Context, input *corev1.ConfigMap, plan catalog.Plan, hash string, current *corev1.ConfigMap, r *catalogRun, resolved osimage.Catalog) (reconcile.Result, error) {
	name := input.Namespace
	cm, err := catalog.ConfigMap(name, resolved, hash)
	if err != nil {
		// Too large for a ConfigMap: only new values can fix it.
		return c.refuse(ctx, input, reasonValuesInvalid, err)
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
	if err := staleOr(err); errors.Is(err, errStale) {
		c.log.V(1).Info("os-images-info not written, deciding again", "namespace", name, "reason", err.Error())
		return reconcile.Result{RequeueAfter: requeueStale}, nil
	} else if err != nil {
		return reconcile.Result{}, fmt.Errorf("writing ConfigMap %s/%s: %w", name, osimage.InfoConfigMapName, err)
	}
	c.mu.Lock()
	if c.runs[name] == r {
		delete(c.runs, name)
	}
	c.mu.Unlock()
	c.metrics.catalogRun(name, catalogOutcomes[reasonPublished].result)
	c.metrics.catalogState(name, catalogOutcomes[reasonPublished].state)
	// Say what was checked, never more.
	c.log.Info("catalog published", "namespace", name, "images", len(resolved), "inputsHash", hash,
		"signaturesVerified", len(plan.Sources)-len(plan.Unchecked())-countHTTP(plan), "ociImagesWithoutKey", plan.Unchecked())
	c.event(input, reasonPublished, "os-images-info published: %d images", len(resolved))
	return c.setStatus(ctx, input, osimage.CatalogStatus{State: catalogOutcomes[reasonPublished].state, InputsHash: hash, Images: len(resolved)})
}

func countHTTP(p catalog.Plan) int {
	n := 0
	for _, s := range p.Sources {
		if !s.IsOCI() {
			n++
		}
	}
	return n
}

// failed reports a run that did not publish: in the log, an event, the
// status and the metrics.
func (c *catalogReconciler) failed(ctx context.Context, input *corev1.ConfigMap, hash string, err error, retry time.Duration) (reconcile.Result, error) {
	name := input.Namespace
	reason := reasonFailed
	msg := fmt.Sprintf("os-images-info not updated: %v; retried in %s", err, retry.Round(time.Second))
	if errors.Is(err, errRunBudget) {
		reason = reasonTimedOut
		msg = fmt.Sprintf("os-images-info not updated: the run was stopped after its budget of %s (--catalog-run-timeout): %v; are its registries answering? Retried in %s",
			c.opts.RunTimeout, err, retry.Round(time.Second))
	}
	out := catalogOutcomes[reason]
	c.metrics.catalogRun(name, out.result)
	c.metrics.catalogState(name, out.state)
	c.log.Error(err, "catalog not published; the last os-images-info stays", "namespace", name, "state", out.state, "retryIn", retry.Round(time.Second).String())
	c.event(input, reason, "%s", msg)
	return c.setStatus(ctx, input, osimage.CatalogStatus{State: out.state, InputsHash: hash, Message: msg})
}

// refuse reports inputs that no retry can fix; the next change of the
// ConfigMaps triggers a new attempt. A run of older inputs is stopped.
func (c *catalogReconciler) refuse(ctx context.Context, input *corev1.ConfigMap, reason catalogReason, err error) (reconcile.Result, error) {
	name := input.Namespace
	c.cancelRun(name, "", errInputsChanged)
	msg := err.Error()
	c.mu.Lock()
	known := c.refused[name] == msg
	c.refused[name] = msg
	c.mu.Unlock()
	if !known {
		// Once per new refusal, not per reconcile.
		c.metrics.catalogRun(name, catalogOutcomes[reason].result)
		c.log.Info("catalog inputs refused; fix them, os-images-info is left as it is", "namespace", name, "reason", reason, "error", msg)
		c.event(input, reason, "%s", msg)
	}
	c.metrics.catalogState(name, catalogOutcomes[reason].state)
	return c.setStatus(ctx, input, osimage.CatalogStatus{State: catalogOutcomes[reason].state, Message: msg})
}

// setStatus writes the catalog's state into osimages-status when it
// changed. A user's own osimages-status is never written: an event says
// so instead.
func (c *catalogReconciler) setStatus(ctx context.Context, input *corev1.ConfigMap, s osimage.CatalogStatus) (reconcile.Result, error) {
	name := input.Namespace
	previous := &corev1.ConfigMap{}
	if err := c.reader.Get(ctx, types.NamespacedName{Namespace: name, Name: osimage.StatusConfigMapName}, previous); err != nil {
		if !apierrors.IsNotFound(err) {
			return reconcile.Result{}, err
		}
		previous = nil
	}
	if previous != nil {
		var old osimage.CatalogStatus
		if doc, ok := previous.Data[osimage.CatalogStatusKey]; ok && yaml.Unmarshal([]byte(doc), &old) == nil && sameCatalogStatus(old, s) {
			return reconcile.Result{}, nil
		}
	}
	s.Since = c.now().UTC().Format(time.RFC3339)
	doc, err := yaml.Marshal(s)
	if err != nil {
		return reconcile.Result{}, err
	}
	err = writeStatusKey(ctx, c.writer, catalogFieldOwner, previous, name, osimage.CatalogStatusKey, string(doc))
	switch {
	case errors.Is(err, errStale):
		c.log.V(1).Info("catalog status not written, deciding again", "namespace", name, "reason", err.Error())
		return reconcile.Result{RequeueAfter: requeueStale}, nil
	case errors.Is(err, errNotOurs):
		c.event(previous, reasonStatusNameTaken, "%v", err)
		return reconcile.Result{}, nil
	case err != nil:
		return reconcile.Result{}, fmt.Errorf("writing the catalog status in ConfigMap %s/%s: %w", name, osimage.StatusConfigMapName, err)
	}
	return reconcile.Result{}, nil
}

func countImages(cm *corev1.ConfigMap) int {
	cat, err := osimage.ParseInfo([]byte(cm.Data[osimage.ValuesKey]))
	if err != nil {
		return 0
	}
	return len(cat)
}

// event regards the given ConfigMap (the first catalog-values one: what
// the operator edits, in the namespace concerned), of the type the table
// gives its reason.
func (c *catalogReconciler) event(regarding *corev1.ConfigMap, reason catalogReason, format string, args ...any) {
	c.recorder.Eventf(regarding, nil, catalogOutcomes[reason].eventType, string(reason), eventActionCatalog, format, args...)
}

// catalogReason is the reason of a catalog event, Flux's way: a run either
// publishes, fails for a while (retried: Failed, TimedOut), or is refused
// until its inputs change (no retry fixes them: the rest).
type catalogReason string

const (
	reasonPublished          catalogReason = "CatalogPublished"
	reasonFailed             catalogReason = "CatalogFailed"
	reasonTimedOut           catalogReason = "CatalogTimedOut"
	reasonInputTooLarge      catalogReason = "CatalogInputTooLarge"
	reasonValuesInvalid      catalogReason = "CatalogValuesInvalid"
	reasonRegistryNotAllowed catalogReason = "CatalogRegistryNotAllowed"
	reasonStatusNameTaken    catalogReason = "StatusNameTaken"
)

// catalogOutcomes is the one place that maps a reason to what it leaves:
// the catalog's state in osimages-status and the metrics (state; "" when
// it leaves the state as it is), the event's type, and the run's result
// counted (result; "" when no run ends).
var catalogOutcomes = map[catalogReason]struct{ state, eventType, result string }{
	reasonPublished:          {osimage.CatalogPublished, corev1.EventTypeNormal, "published"},
	reasonFailed:             {osimage.CatalogFailed, corev1.EventTypeWarning, "failed"},
	reasonTimedOut:           {osimage.CatalogTimedOut, corev1.EventTypeWarning, "timeout"},
	reasonInputTooLarge:      {osimage.CatalogRefused, corev1.EventTypeWarning, "refused"},
	reasonValuesInvalid:      {osimage.CatalogRefused, corev1.EventTypeWarning, "refused"},
	reasonRegistryNotAllowed: {osimage.CatalogRefused, corev1.EventTypeWarning, "refused"},
	reasonStatusNameTaken:    {"", corev1.EventTypeWarning, ""},
}

// runningSince lists the start of every run in progress, for the
// osimages_catalog_run_seconds metric.
func (c *catalogReconciler) runningSince() map[string]time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]time.Time{}
	for ns, r := range c.runs {
		if !r.done {
			out[ns] = r.started
		}
	}
	return out
}
