package server

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/sylva-projects/osimages/internal/kube"
	"github.com/sylva-projects/osimages/internal/osimage"
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
	Client            kubernetes.Interface
	ValueFiles        []string
	// Waiting, when set, is told why there is no catalog yet, as long as
	// none was loaded (see ErrNoCatalogYet).
	Waiting func(error)
	// Poll is how often files are checked for changes (default 2s).
	Poll   time.Duration
	Logger *slog.Logger
}

// Load reads the inputs once.
func (in Inputs) Load(ctx context.Context) (osimage.Catalog, values.Values, []byte, error) {
	var doc []byte
	var err error
	if in.OSImagesConfigMap != nil {
		doc, err = in.catalogDocument(ctx)
	} else {
		doc, err = osimage.ReadValuesDocument(in.OSImagesFile)
	}
	if err != nil {
		return nil, nil, nil, err
	}
	cat, err := osimage.ParseInfo(doc)
	if err != nil {
		return nil, nil, nil, err
	}
	vals, err := values.LoadFiles(in.ValueFiles...)
	if err != nil {
		return nil, nil, nil, err
	}
	// The fingerprint tells a real change from a touch of a file; it is
	// taken from what was parsed, so it can never disagree with it.
	h := sha256.New()
	h.Write(doc)
	if err := json.NewEncoder(h).Encode(vals); err != nil {
		return nil, nil, nil, err
	}
	return cat, vals, h.Sum(nil), nil
}

// Watch calls apply with the inputs now and whenever they change: a file
// whose content changed, a trigger (SIGHUP), or an event of the watched
// ConfigMap. Inputs that fail to load are logged and the last good ones
// stay in force: a broken edit must never empty the served set.
func (in Inputs) Watch(ctx context.Context, trigger <-chan os.Signal, apply func(osimage.Catalog, values.Values)) error {
	log := in.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	poll := in.Poll
	if poll <= 0 {
		poll = 2 * time.Second
	}
	events := make(chan struct{}, 1)
	if in.OSImagesConfigMap != nil {
		if err := in.watchConfigMap(ctx, events); err != nil {
			return err
		}
	}
	var last []byte
	var waitingFor string
	reload := func(why string) {
		cat, vals, fp, err := in.Load(ctx)
		if err != nil && last == nil && errors.Is(err, ErrNoCatalogYet) {
			// A fresh install: not an error, and said once per cause.
			if err.Error() != waitingFor {
				waitingFor = err.Error()
				log.Info("waiting for the catalog", "reason", why, "detail", err.Error())
			}
			if in.Waiting != nil {
				in.Waiting(err)
			}
			return
		}
		if err != nil {
			log.Error("reading the inputs failed; keeping the last good ones", "reason", why, "error", err)
			return
		}
		if bytes.Equal(fp, last) {
			return
		}
		last = fp
		log.Info("inputs loaded", "reason", why, "images", len(cat))
		apply(cat, vals)
	}
	reload("start")
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

// catalogDocument reads the watched catalog ConfigMap. One that does not
// exist yet, or holds no values.yaml yet (as the chart creates it for the
// catalog Job), is ErrNoCatalogYet.
func (in Inputs) catalogDocument(ctx context.Context) ([]byte, error) {
	key := *in.OSImagesConfigMap
	cm, err := kube.GetConfigMap(ctx, in.Client, key)
	if err != nil {
		return nil, err
	}
	if cm == nil {
		return nil, fmt.Errorf("%w: ConfigMap %s does not exist yet (the catalog Job, the controller or Sylva's os-images-info unit writes it)", ErrNoCatalogYet, key)
	}
	doc, ok := cm.Data[osimage.ValuesKey]
	if !ok {
		return nil, fmt.Errorf("%w: ConfigMap %s has no %s yet (the catalog Job, the controller or Sylva's os-images-info unit fills it)", ErrNoCatalogYet, key, osimage.ValuesKey)
	}
	return []byte(doc), nil
}

func (in Inputs) watchConfigMap(ctx context.Context, events chan<- struct{}) error {
	key := *in.OSImagesConfigMap
	factory := informers.NewSharedInformerFactoryWithOptions(in.Client, 10*time.Minute,
		informers.WithNamespace(key.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", key.Name).String()
		}))
	informer := factory.Core().V1().ConfigMaps().Informer()
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
		return err
	}
	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), informer.HasSynced) {
		return fmt.Errorf("watching ConfigMap %s: cache did not sync", key)
	}
	return nil
}
