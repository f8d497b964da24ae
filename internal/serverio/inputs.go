// Package serverio is what the image server reads and writes: its inputs
// (the management cluster's os_images and values, and the fleet's needs,
// from files or watched ConfigMaps, refused whole when they cannot be
// used) and its output (the served set, to a file or a ConfigMap that it
// restores when someone else changes it).
package serverio

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/tools/cache"

	"github.com/sylva-projects/osimages/internal/kube"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/servedset"
	"github.com/sylva-projects/osimages/internal/values"
)

// Inputs are where the server reads what to serve: the management cluster's
// os_images (a file, or a ConfigMap it watches) and its values files.
type Inputs struct {
	// OSImagesFile is an os_images document or an os-images-info ConfigMap
	// manifest.
	OSImagesFile string
	// OSImagesConfigMap, with Client, is read and watched instead.
	OSImagesConfigMap *kube.ObjectKey
	// FleetNeedsConfigMap, when set (--serve-fleet-needs), is the fleet's
	// needs the controller publishes, watched as a third input.
	FleetNeedsConfigMap *kube.ObjectKey
	Client              kube.Client
	ValueFiles          []string
	// Poll is how often files are checked for changes (default 2s).
	Poll   time.Duration
	Logger *slog.Logger
	// Waiting, when set, is told why there is no catalog yet, as long as
	// none was loaded (see ErrNoCatalogYet).
	Waiting func(error)
	// Report, when set, is told the fate of each new reading of the
	// inputs: nil once it is in force, the *RefusedError otherwise
	// (Server.ReportInputs shows it on the status page and in metrics).
	Report func(refused error)

	// configMaps is the informer's store of the watched ConfigMap, once
	// Watch started it: readings come from it, not from a GET per event
	// and per poll.
	configMaps cache.Store
	// fleetNeeds is the informer's store of FleetNeedsConfigMap.
	fleetNeeds cache.Store
}

// Loaded is one reading of the inputs.
type Loaded struct {
	Catalog osimage.Catalog
	Values  values.Values
	// Needs are the fleet's needs, nil without FleetNeedsConfigMap, or
	// when NeedsError says why the document cannot be used: the caller
	// keeps the last needs it used, and management inputs still apply.
	Needs      *osimage.FleetNeeds
	NeedsError error
	// NeedsDropped are the entries of the document left out (a malformed
	// sha256): the others are in Needs.
	NeedsDropped []error
}

// Refusal says why inputs were refused.
type Refusal string

// The reasons inputs are refused, as the metrics label them.
const (
	// RefusalUnreadable: a file or the ConfigMap cannot be read or parsed.
	RefusalUnreadable Refusal = "unreadable"
	// RefusalNearMiss: a key osimages reads is absent and a look-alike of
	// it present (os_image for os_images).
	RefusalNearMiss Refusal = "near-miss"
	// RefusalEmpty: the inputs select no image while images are served.
	RefusalEmpty Refusal = "empty"
	// RefusalTooLarge: the served set would not fit in a ConfigMap.
	RefusalTooLarge Refusal = "too-large"
)

// Refusals are every reason, in the order the metrics list them.
var Refusals = []Refusal{RefusalUnreadable, RefusalNearMiss, RefusalEmpty, RefusalTooLarge}

// RefusedError is inputs that are not put in force: the last good ones
// stay, and nothing that is served changes.
type RefusedError struct {
	Reason Refusal
	Err    error
}

func (e *RefusedError) Error() string { return e.Err.Error() }
func (e *RefusedError) Unwrap() error { return e.Err }

// AsRefused wraps err as a RefusedError; an error that is not one already
// is a reading that failed.
func AsRefused(err error) *RefusedError {
	var r *RefusedError
	if errors.As(err, &r) {
		return r
	}
	return &RefusedError{Reason: RefusalUnreadable, Err: err}
}

// ErrNoCatalogYet marks inputs whose catalog is not written yet (Load
// wraps it): the ConfigMap does not exist or holds no values.yaml.
var ErrNoCatalogYet = errors.New("no catalog yet")

// Load reads the inputs once. It refuses, like a document that does not
// parse, one that lacks a key the server reads while it holds a look-alike
// of it (values.NearMiss). The fingerprint tells a real change from a touch
// of a file.
func (in Inputs) Load(ctx context.Context) (Loaded, []byte, error) {
	doc, source, err := in.readOSImages(ctx)
	if err != nil {
		return Loaded{}, nil, err
	}
	top, err := values.Parse(doc)
	if err != nil {
		return Loaded{}, nil, fmt.Errorf("%s: parsing os_images document: %w", source, err)
	}
	if errs := values.NearMisses(top, "", "os_images"); len(errs) > 0 {
		return Loaded{}, nil, &RefusedError{Reason: RefusalNearMiss, Err: fmt.Errorf("%s: %w", source, errors.Join(errs...))}
	}
	cat, err := osimage.ParseInfo(doc)
	if err != nil {
		return Loaded{}, nil, fmt.Errorf("%s: %w", source, err)
	}
	vals, err := values.LoadFiles(in.ValueFiles...)
	if err != nil {
		return Loaded{}, nil, err
	}
	if errs := servedset.ValuesNearMisses(vals); len(errs) > 0 {
		return Loaded{}, nil, &RefusedError{Reason: RefusalNearMiss, Err: fmt.Errorf("values %s: %w", strings.Join(in.ValueFiles, ", "), errors.Join(errs...))}
	}
	l := Loaded{Catalog: cat, Values: vals}
	l.Needs, l.NeedsDropped, l.NeedsError = in.readFleetNeeds(ctx)
	// The fingerprint is taken from what was parsed, so it can never
	// disagree with it.
	h := sha256.New()
	h.Write(doc)
	if err := json.NewEncoder(h).Encode(vals); err != nil {
		return Loaded{}, nil, err
	}
	if err := json.NewEncoder(h).Encode(l.Needs); err != nil {
		return Loaded{}, nil, err
	}
	fmt.Fprintln(h, errors.Join(l.NeedsError, errors.Join(l.NeedsDropped...)))
	return l, h.Sum(nil), nil
}

// readOSImages returns the os_images document and names where it was
// read. A watched ConfigMap that does not exist yet, or holds no
// values.yaml yet (as the chart creates it for the catalog Job to fill), is
// ErrNoCatalogYet.
func (in Inputs) readOSImages(ctx context.Context) ([]byte, string, error) {
	if in.OSImagesConfigMap == nil {
		doc, err := osimage.ReadValuesDocument(in.OSImagesFile)
		return doc, in.OSImagesFile, err
	}
	key := *in.OSImagesConfigMap
	source := "ConfigMap " + key.String()
	cm, err := in.configMap(ctx, in.configMaps, key)
	if err != nil {
		return nil, source, err
	}
	if cm == nil {
		return nil, source, fmt.Errorf("%w: %s does not exist yet (the catalog Job, the controller or Sylva's os-images-info unit writes it)", ErrNoCatalogYet, source)
	}
	doc, ok := cm.Data[osimage.ValuesKey]
	if !ok {
		return nil, source, fmt.Errorf("%w: %s has no %s yet (the catalog Job, the controller or Sylva's os-images-info unit fills it)", ErrNoCatalogYet, source, osimage.ValuesKey)
	}
	return []byte(doc), source, nil
}

// configMap returns the ConfigMap of key, nil when it does not exist: from
// store, the informer's, once the inputs are watched, else from the
// apiserver.
func (in Inputs) configMap(ctx context.Context, store cache.Store, key kube.ObjectKey) (*corev1.ConfigMap, error) {
	if store == nil {
		return kube.GetConfigMap(ctx, in.Client, key)
	}
	obj, exists, err := store.GetByKey(key.String())
	if err != nil || !exists {
		return nil, err
	}
	cm, _ := obj.(*corev1.ConfigMap)
	return cm, nil
}

// Watch calls apply with the inputs now and whenever they change: a file
// whose content changed, a trigger (SIGHUP), or an event of the watched
// ConfigMap. Inputs that cannot be read, that hold a near-miss of a key, or
// that apply refuses (it returns an error, such as Server.Admit's) are
// logged once and reported, and the last good ones stay in force: a broken
// edit never empties the served set. Before the first good inputs there
// is nothing to keep: Watch returns the reason at once, except for a
// catalog that is not written yet (ErrNoCatalogYet: the catalog may be
// about to write it), which is waited for, as a phase and not an error
// (Inputs.Waiting). Once inputs were good, a catalog that goes is a
// refusal like any other.
func (in Inputs) Watch(ctx context.Context, trigger <-chan os.Signal, apply func(Loaded) error) error {
	log := in.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	report := in.Report
	if report == nil {
		report = func(error) {}
	}
	poll := in.Poll
	if poll <= 0 {
		poll = 2 * time.Second
	}
	events := make(chan struct{}, 1)
	if in.OSImagesConfigMap != nil {
		store, err := in.watchConfigMap(ctx, *in.OSImagesConfigMap, events)
		if err != nil {
			return err
		}
		in.configMaps = store
	}
	if in.FleetNeedsConfigMap != nil {
		store, err := in.watchConfigMap(ctx, *in.FleetNeedsConfigMap, events)
		if err != nil {
			return err
		}
		in.fleetNeeds = store
	}
	// good is the fingerprint of the inputs in force; bad that of the last
	// inputs refused, and said the message of that refusal, so that a
	// refusal is logged and counted once, not at every poll.
	var good, bad []byte
	var said string
	reload := func(why string) error {
		l, fp, err := in.Load(ctx)
		switch {
		case err == nil && bytes.Equal(fp, good):
			if said != "" {
				log.Info("inputs back to the ones in force", "reason", why)
				bad, said = nil, ""
				report(nil)
			}
			return nil
		case err == nil && bytes.Equal(fp, bad):
			return nil
		case err == nil:
			err = apply(l)
		}
		if err != nil && good == nil && errors.Is(err, ErrNoCatalogYet) {
			// A fresh install: not an error, and said once per cause.
			if err.Error() != said {
				said = err.Error()
				log.Info("waiting for the catalog; nothing is selected until it is written, stored images are kept", "reason", why, "detail", said)
			}
			if in.Waiting != nil {
				in.Waiting(err)
			}
			return nil
		}
		if err != nil {
			r := AsRefused(err)
			if good == nil {
				report(r)
				return r
			}
			if r.Error() != said {
				bad, said = fp, r.Error()
				log.Error("inputs refused; the last good ones stay in force", "reason", why, "refusal", string(r.Reason), "error", r.Error())
				report(r)
			}
			return nil
		}
		good, bad, said = fp, nil, ""
		log.Info("inputs loaded", "reason", why, "images", len(l.Catalog))
		report(nil)
		return nil
	}
	if err := reload("start"); err != nil {
		return fmt.Errorf("the inputs cannot be used, and there are no last good ones to keep: %w", err)
	}
	tick := time.NewTicker(poll)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-trigger:
			reload("signal")
		case <-events:
			reload("configmap event")
		case <-tick.C:
			reload("poll")
		}
	}
}

// watchConfigMap starts an informer on the watched ConfigMap alone, which
// signals events, and returns its store once it is synced.
func (in Inputs) watchConfigMap(ctx context.Context, key kube.ObjectKey, events chan<- struct{}) (cache.Store, error) {
	informer := configMapInformer(in.Client, key, 10*time.Minute)
	notify := func(any) {
		select {
		case events <- struct{}{}:
		default:
		}
	}
	if _, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    notify,
		UpdateFunc: func(_, obj any) { notify(obj) },
		DeleteFunc: notify,
	}); err != nil {
		return nil, err
	}
	go informer.RunWithContext(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), informer.HasSynced) {
		return nil, fmt.Errorf("watching ConfigMap %s: cache did not sync", key)
	}
	return informer.GetStore(), nil
}

// configMapInformer is an informer on one ConfigMap, by name: a list and a
// watch with a metadata.name field selector, which RBAC's resourceNames
// admit.
func configMapInformer(client kube.Client, key kube.ObjectKey, resync time.Duration) cache.SharedIndexInformer {
	return kube.NewInformer(client, client.CoreV1().ConfigMaps(key.Namespace), &corev1.ConfigMap{}, resync, func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", key.Name).String()
	})
}

// readFleetNeeds returns the fleet's needs, nil when they are not an
// input. A ConfigMap that does not exist yet, or has no needs.yaml, is no
// need: the controller may not run, or not have checked yet. One that does
// not parse, or that osimages did not write (without osimage.FleetNeedsLabel),
// is an error: the caller keeps the needs it had, and the management
// inputs are read and applied all the same, for a tenant must never stop
// them. Entries that cannot be used are dropped alone.
func (in Inputs) readFleetNeeds(ctx context.Context) (*osimage.FleetNeeds, []error, error) {
	if in.FleetNeedsConfigMap == nil {
		return nil, nil, nil
	}
	key := *in.FleetNeedsConfigMap
	cm, err := in.configMap(ctx, in.fleetNeeds, key)
	if err != nil {
		return nil, nil, err
	}
	needs := &osimage.FleetNeeds{}
	if cm == nil || cm.Data[osimage.FleetNeedsKey] == "" {
		return needs, nil, nil
	}
	if _, ours := cm.Labels[osimage.FleetNeedsLabel]; !ours {
		return nil, nil, fmt.Errorf("ConfigMap %s has no label %s: osimages' controller did not write it, so its needs are not served; delete it and let the controller (--fleet-needs) write its own", key, osimage.FleetNeedsLabel)
	}
	parsed, dropped, err := osimage.ParseFleetNeeds(cm.Data[osimage.FleetNeedsKey])
	if err != nil {
		return nil, nil, fmt.Errorf("ConfigMap %s: %w", key, err)
	}
	for i, d := range dropped {
		dropped[i] = fmt.Errorf("ConfigMap %s: %w", key, d)
	}
	return &parsed, dropped, nil
}
