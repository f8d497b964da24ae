package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"

	"github.com/sylva-projects/osimages/internal/catalog"
	"github.com/sylva-projects/osimages/internal/imagestore"
	"github.com/sylva-projects/osimages/internal/kube"
	"github.com/sylva-projects/osimages/internal/metal3"
	"github.com/sylva-projects/osimages/internal/oci"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/pull"
	"github.com/sylva-projects/osimages/internal/selection"
	"github.com/sylva-projects/osimages/internal/server"
	"github.com/sylva-projects/osimages/internal/signature"
	"github.com/sylva-projects/osimages/internal/values"
)

type serveOptions struct {
	data            string
	listen          string
	osImages        string
	osImagesCM      string
	kubeconfig      string
	valueFiles      []string
	outputFile      string
	outputCM        string
	concurrency     int
	gcGrace         time.Duration
	maxStorage      string
	freeSpaceMargin string
	tlsCert, tlsKey string
	caFile          string
	registryConfig  string
	poll            time.Duration
	keepReferenced  bool
	stallTimeout    time.Duration
	minRate         string
	maxImageSize    string
	allowEmpty      bool
}

// shutdownGrace is how long HTTP responses in flight get to finish after
// SIGTERM or SIGINT before their connections are closed; downloads from
// registries stop at once.
const shutdownGrace = 5 * time.Second

func newServeCommand() *cobra.Command {
	o := serveOptions{}
	cmd := &cobra.Command{
		Use:   "serve --data DIR (--os-images FILE | --os-images-configmap NS/NAME) -f mgmt-values.yaml (--output-file FILE | --output-configmap NS/NAME)",
		Short: "Pull, verify, store and serve the management cluster's OS images over HTTP, and publish what is served",
		Long: `serve is the image server of the management cluster. It serves every image of
os_images that one of the management cluster's own finalized selectors designates
(control plane and machine deployment levels of the -f values), or that one of
os_image_server_additional_selectors matches. Each image is pulled from its OCI
artifact or HTTP(S) URL in one streaming pass, verified (OCI blob digest, sha256,
md5; for an OCI artifact of a registry with a cosign_publickey, first the
pinned manifest digest and the cosign signature, before any byte is
downloaded), stored by sha256, and served at /images/<sha256>/<filename>, with
<filename>.sha256sum and <filename>.md5sum beside it.

What is served is published as capm3_os_image_server_images (contract §6) to a
file or a ConfigMap, whenever it changes. Inputs are re-read when a file changes,
the ConfigMap changes, or on SIGHUP. Inputs that cannot be read, that lack a
key the server reads while holding a look-alike of it (os_image for
os_images), or that would empty a served set that is not empty (unless
--allow-empty) are refused: the last good ones stay in force, and the status
page and osimages_inputs_refused say so. At start there are none: serve
exits 2 with the reason. /, /healthz, /readyz and /metrics are served on the
same address.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runServe(cmd.Context(), o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.data, "data", "", "data directory holding the stored images")
	f.StringVar(&o.listen, "listen", ":8080", "address to serve HTTP(S) on")
	f.StringVar(&o.osImages, "os-images", "", "os_images document or os-images-info ConfigMap manifest")
	f.StringVar(&o.osImagesCM, "os-images-configmap", "", "read and watch os_images from this ConfigMap, NS/NAME")
	f.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file (default $KUBECONFIG, ~/.kube/config or in-cluster)")
	f.StringArrayVarP(&o.valueFiles, "values", "f", nil, "management cluster values; repeat to merge several, later wins")
	f.StringVar(&o.outputFile, "output-file", "", "write the served-images document to this file")
	f.StringVar(&o.outputCM, "output-configmap", "", "apply the served-images ConfigMap, NS/NAME (Sylva: "+osimage.ServedConfigMapNamespace+"/"+osimage.ServedConfigMapName+")")
	f.IntVar(&o.concurrency, "concurrency", server.DefaultConcurrency, "downloads at once")
	f.DurationVar(&o.gcGrace, "gc-grace", server.DefaultGCGrace, "how long a deselected image stays on disk before it is deleted (0: at the next collection)")
	f.StringVar(&o.maxStorage, "max-storage", "", "bound on the bytes of stored images and downloads, as a quantity such as 200Gi (default: the disk)")
	f.StringVar(&o.freeSpaceMargin, "free-space-margin", "1Gi", "free disk space kept besides what downloads reserve (0: none)")
	f.StringVar(&o.maxImageSize, "max-image-size", "64Gi", "largest image file: the bound of an image that declares no size (reserved on disk for its download), and the most an image may declare")
	f.DurationVar(&o.stallTimeout, "stall-timeout", server.DefaultStallTimeout, "a download that receives no byte for this long (manifest included) is cut and retried with backoff; it is also the window of --min-rate")
	f.StringVar(&o.minRate, "min-rate", "64Ki", "bytes per second below which a download, measured over --stall-timeout, gives way to images waiting for a slot (0: never)")
	f.StringVar(&o.tlsCert, "tls-cert", "", "serve HTTPS with this certificate (PEM)")
	f.StringVar(&o.tlsKey, "tls-key", "", "private key of --tls-cert (PEM)")
	f.DurationVar(&o.poll, "poll", 2*time.Second, "how often input files are checked for changes")
	f.BoolVar(&o.allowEmpty, "allow-empty", false, "accept inputs that select no image while images are served, to empty the served set on purpose (refused otherwise, and the last good inputs stay in force)")
	f.BoolVar(&o.keepReferenced, "keep-referenced", true, "never delete, and keep serving, a deselected image that a Metal3MachineTemplate or Metal3Machine still references (needs list/watch on them cluster-wide)")
	addRegistryFlags(f, &o.caFile, &o.registryConfig)
	_ = cmd.MarkFlagRequired("data")
	_ = cmd.MarkFlagRequired("values")
	return cmd
}

func runServe(ctx context.Context, o serveOptions) error {
	if (o.osImages == "") == (o.osImagesCM == "") {
		return inputError(errors.New("give exactly one of --os-images and --os-images-configmap"))
	}
	if o.outputFile != "" && o.outputCM != "" {
		return inputError(errors.New("give at most one of --output-file and --output-configmap"))
	}
	if (o.tlsCert == "") != (o.tlsKey == "") {
		return inputError(errors.New("--tls-cert and --tls-key go together"))
	}
	limits, err := o.limits()
	if err != nil {
		return inputError(err)
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))

	store, err := imagestore.Open(o.data, imagestore.WithLogger(log))
	if err != nil {
		return inputError(fmt.Errorf("--data %s: %w", o.data, err))
	}
	defer store.Close()
	inputs := server.Inputs{OSImagesFile: o.osImages, ValueFiles: o.valueFiles, Poll: o.poll, Logger: log}
	var publisher server.Publisher
	if o.outputFile != "" {
		publisher = server.FilePublisher{Path: o.outputFile}
	}
	if o.osImagesCM != "" || o.outputCM != "" {
		cluster, err := newKubeTarget(o.kubeconfig)
		if err != nil {
			return inputError(err)
		}
		inputs.Client = cluster.client
		if o.osImagesCM != "" {
			key, err := kube.ParseObjectKey(o.osImagesCM)
			if err != nil {
				return inputError(fmt.Errorf("--os-images-configmap %w", err))
			}
			inputs.OSImagesConfigMap = &key
		}
		if o.outputCM != "" {
			key, err := kube.ParseObjectKey(o.outputCM)
			if err != nil {
				return inputError(fmt.Errorf("--output-configmap %w", err))
			}
			publisher = server.ConfigMapPublisher{Client: cluster.client, Key: key}
		}
	}

	secure, insecure, err := newPullers(o.caFile, o.registryConfig, o.concurrency, o.stallTimeout)
	if err != nil {
		return inputError(err)
	}
	var useInsecure atomic.Bool
	choose := func() *pull.Puller {
		if useInsecure.Load() {
			return insecure
		}
		return secure
	}
	var refs *metal3.References
	if o.keepReferenced {
		if refs, err = newReferences(o.kubeconfig, log); err != nil {
			if o.osImagesCM != "" || o.outputCM != "" {
				return inputError(err)
			}
			// Without a cluster there is no Metal3 object to reference an
			// image: files-only serving (a lab, the demo) needs no guard.
			log.Warn("reference-safe garbage collection is off: no cluster to read Metal3 objects from (--keep-referenced=false silences this)", "error", err.Error())
		}
	}
	// The cosign keys in force, from the values last applied. Until the
	// first values are read, no OCI image can be pulled: fail closed.
	var trust atomic.Pointer[trustState]
	currentTrust := func() (signature.Policy, error) {
		if t := trust.Load(); t != nil {
			return t.trust, t.err
		}
		return signature.Policy{}, errors.New("the management values are not read yet")
	}
	metrics := server.NewMetrics()
	cfg := limits
	cfg.Store, cfg.Pull, cfg.Publisher, cfg.Logger, cfg.Metrics = store, server.PullWith(choose, currentTrust), publisher, log, metrics
	cfg.AllowEmpty = o.allowEmpty
	if refs != nil {
		cfg.References = refs
	}
	srv := server.New(cfg)
	inputs.Report = srv.ReportInputs
	inputs.Waiting = srv.WaitForCatalog

	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return inputError(fmt.Errorf("--listen %s: %w", o.listen, err))
	}
	httpServer := srv.HTTPServer()
	log.Info("serving", "address", ln.Addr().String(), "tls", o.tlsCert != "", "data", o.data)

	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		err := inputs.Watch(gctx, hup, func(in server.Loaded) error {
			cat, vals := in.Catalog, in.Values
			wanted, selErr := selection.Select(vals, cat)
			if err := srv.Admit(gctx, wanted); err != nil {
				return err
			}
			insecure, _ := values.Bool(vals, "oci_registry_insecure", "oci_registry_insecure", false)
			useInsecure.Store(insecure)
			t, trustErr := catalog.PolicyFromValues(vals)
			trust.Store(&trustState{trust: t, err: trustErr})
			switch {
			case trustErr != nil:
				trustErr = fmt.Errorf("OCI images are not pulled until the cosign keys can be read: %w", trustErr)
				log.Error("signature policy unreadable", "error", trustErr)
			case t.Skip && len(t.Keys) > 0:
				log.Warn(catalog.SkipPath+" is true: cosign signatures are NOT checked", "registriesWithKey", len(t.Keys))
			case len(t.Keys) > 0 || t.Require:
				// Name the scope of the check: an OCI image under no keyed
				// registry is not checked unless signatures are required.
				var keyed []string
				for _, k := range t.Keys {
					keyed = append(keyed, k.Registry+"="+k.URL)
				}
				others := "pulled unchecked (" + catalog.RequirePath + ": true refuses them)"
				if t.Require {
					others = "refused (" + catalog.RequirePath + ")"
				}
				log.Info("cosign signatures are checked before the download of images under these registries", "registries", keyed, "otherOCIImages", others)
			}
			if selErr != nil {
				log.Error("selection problems (the other images are still served)", "error", selErr)
			}
			srv.SetDesired(wanted, errors.Join(selErr, trustErr))
			return nil
		})
		var refused *server.RefusedError
		if errors.As(err, &refused) {
			// At start: there are no last good inputs to serve from.
			return inputError(err)
		}
		return err
	})
	g.Go(func() error { return srv.Run(gctx) })
	if refs != nil {
		g.Go(func() error { refs.Run(gctx, time.Minute); return nil })
	}
	g.Go(func() error {
		var err error
		if o.tlsCert != "" {
			err = httpServer.ServeTLS(ln, o.tlsCert, o.tlsKey)
		} else {
			err = httpServer.Serve(ln)
		}
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return err
	})
	g.Go(func() error {
		<-gctx.Done()
		log.Info("shutting down", "grace", shutdownGrace.String())
		shutdown, cancel := context.WithTimeout(context.Background(), shutdownGrace)
		defer cancel()
		if err := httpServer.Shutdown(shutdown); err != nil {
			// Responses still in flight (a client in the middle of an
			// image) are cut: the process must end.
			httpServer.Close()
		}
		return nil
	})
	return g.Wait()
}

// limits checks the flags that bound the server's work and returns them as
// a Config. Every value is used as given, zero included where it means
// something, or refused: none is replaced by a default behind the
// operator's back.
func (o serveOptions) limits() (server.Config, error) {
	var errs []error
	if o.concurrency < 1 {
		errs = append(errs, fmt.Errorf("--concurrency %d: at least one download must run at a time", o.concurrency))
	}
	if o.gcGrace < 0 {
		errs = append(errs, fmt.Errorf("--gc-grace %s is negative: give 0 to delete deselected images at the next collection", o.gcGrace))
	}
	if o.poll <= 0 {
		errs = append(errs, fmt.Errorf("--poll %s: the input files must be checked at a positive interval, such as 2s", o.poll))
	}
	if o.stallTimeout <= 0 {
		errs = append(errs, fmt.Errorf("--stall-timeout %s: give a positive duration, such as 60s", o.stallTimeout))
	}
	maxStorage, err := quantity("--max-storage", o.maxStorage)
	if err == nil && o.maxStorage != "" && maxStorage <= 0 {
		err = fmt.Errorf("--max-storage %q: give a positive quantity such as 500Gi, or leave it out for no bound but the disk", o.maxStorage)
	}
	errs = append(errs, err)
	margin, err := quantity("--free-space-margin", o.freeSpaceMargin)
	if err == nil && margin < 0 {
		err = fmt.Errorf("--free-space-margin %q is negative: give 0 for no margin", o.freeSpaceMargin)
	}
	errs = append(errs, err)
	maxImage, err := quantity("--max-image-size", o.maxImageSize)
	if err == nil && maxImage <= 0 {
		err = fmt.Errorf("--max-image-size %q: give a positive quantity such as 64Gi", o.maxImageSize)
	}
	errs = append(errs, err)
	minRate, err := quantity("--min-rate", o.minRate)
	if err == nil && minRate < 0 {
		err = fmt.Errorf("--min-rate %q is negative: give 0 for downloads never to give way", o.minRate)
	}
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return server.Config{}, err
	}
	return server.Config{
		Concurrency: o.concurrency, GCGrace: o.gcGrace, MaxStorage: maxStorage, FreeSpaceMargin: margin,
		MaxImageSize: maxImage, StallTimeout: o.stallTimeout, MinRate: minRate,
	}, nil
}

// trustState is the signature policy read from the values last applied, or
// why it could not be.
type trustState struct {
	trust signature.Policy
	err   error
}

func quantity(flag, s string) (int64, error) {
	if s == "" {
		return 0, nil
	}
	q, err := resource.ParseQuantity(s)
	if err != nil {
		return 0, fmt.Errorf("%s %q: want a quantity such as 500Gi: %w", flag, s, err)
	}
	return q.Value(), nil
}

// newPullers returns a puller for registries verified with TLS and one for
// oci_registry_insecure, which can change with the values. A connection
// that stalls is resumed (a new request at the same offset) after half the
// stall timeout; the server cuts the download at the full one.
func newPullers(caFile, registryConfig string, conns int, stall time.Duration) (secure, insecure *pull.Puller, err error) {
	for _, insecureTLS := range []bool{false, true} {
		client, err := oci.NewClient(oci.Options{Insecure: insecureTLS, CAFile: caFile, RegistryConfig: registryConfig, MaxConnsPerHost: conns})
		if err != nil {
			return nil, nil, err
		}
		p := &pull.Puller{OCI: client, HTTP: client.HTTPClient(), IdleTimeout: stall / 2, ManifestTimeout: stall}
		if insecureTLS {
			insecure = p
		} else {
			secure = p
		}
	}
	return secure, insecure, nil
}

// newReferences returns the tracker of the Metal3 objects that reference
// images, over the cluster of kubeconfig.
func newReferences(kubeconfig string, log *slog.Logger) (*metal3.References, error) {
	cfg, err := kube.RESTConfig(kubeconfig)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	disc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return metal3.NewReferences(dyn, disc, log), nil
}
