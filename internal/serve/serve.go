// Package serve runs the image server of the management cluster as the
// `osimages serve` command does: it opens the store, watches the inputs,
// applies their selection and registry settings to a server.Server,
// publishes what is served, guards referenced images, and serves HTTP
// until its context ends. The demo runs it too.
package serve

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"golang.org/x/sync/errgroup"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/sylva-projects/osimages/internal/clip"
	"github.com/sylva-projects/osimages/internal/exitcode"
	"github.com/sylva-projects/osimages/internal/fleet"
	"github.com/sylva-projects/osimages/internal/imagestore"
	"github.com/sylva-projects/osimages/internal/kube"
	"github.com/sylva-projects/osimages/internal/metal3"
	"github.com/sylva-projects/osimages/internal/oci"
	"github.com/sylva-projects/osimages/internal/selection"
	"github.com/sylva-projects/osimages/internal/server"
)

// Options are those of `osimages serve`, as its flags give them. Errors
// name the flags.
type Options struct {
	Data string
	// Listen is the address to serve on; Listener, when set, is used
	// instead (the demo opens it first to know the address).
	Listen   string
	Listener net.Listener
	// OSImages is an os_images document or an os-images-info ConfigMap
	// manifest; OSImagesConfigMap (NS/NAME) is read and watched instead.
	OSImages, OSImagesConfigMap string
	Kubeconfig                  string
	ValueFiles                  []string
	// OutputFile or OutputConfigMap (NS/NAME) gets the served set.
	OutputFile, OutputConfigMap string
	Concurrency                 int
	GCGrace                     time.Duration
	// MaxStorage, FreeSpaceMargin, MaxImageSize and MinRate are
	// quantities, such as 200Gi; MaxStorage "" is no bound but the disk.
	MaxStorage, FreeSpaceMargin, MaxImageSize, MinRate string
	StallTimeout                                       time.Duration
	TLSCert, TLSKey                                    string
	// Registry is how registries are reached (CA, credentials); the
	// values choose whether TLS is verified.
	Registry       oci.Options
	Poll           time.Duration
	AllowEmpty     bool
	KeepReferenced bool
	// FleetNeeds, when ServeFleetNeeds, adds the images the fleet needs,
	// within policy (fleetneeds.go).
	FleetNeeds FleetNeedsOptions
	// Logger gets the server's log (default: JSON on stderr).
	Logger *slog.Logger

	// Replicas (replicas.go): PeersService, when set, is the headless
	// Service whose ready endpoints are the other replicas; ReplicaID
	// names this one; PeerListen is the peer-only listener; a replica
	// that shows no progress for PeerTimeout is taken over; the Lease
	// PublisherLease elects the one that publishes.
	ReplicaID, PeersService, PeerListen, PublisherLease string
	PeerTimeout                                         time.Duration
	// ScrubInterval is how often each stored image is re-hashed (0: never);
	// ScrubRate, a quantity of bytes per second, bounds the reads.
	ScrubInterval time.Duration
	ScrubRate     string
}

// ShutdownGrace is how long HTTP responses in flight get to finish after
// SIGTERM or SIGINT before their connections are closed; downloads from
// registries stop at once.
const ShutdownGrace = 5 * time.Second

// ShutdownDeadline bounds how long Run takes to return once its context
// ends (SIGTERM, SIGINT), whatever the server is doing: HTTP responses get
// ShutdownGrace, and what has still not ended a few seconds later (a read
// that never returns, from a hung volume say) is left behind, so that the
// process ends. It is well within Kubernetes' default grace of 30 s.
const ShutdownDeadline = ShutdownGrace + 5*time.Second

// Run serves until ctx ends. Wrong options, and inputs that cannot be used
// at start, are exitcode.InputError. Once ctx ends, Run returns within
// ShutdownDeadline, at start too.
func Run(ctx context.Context, o Options) error {
	return boundShutdown(ctx, ShutdownDeadline, func() error {
		d, err := Open(o)
		if err != nil {
			return err
		}
		return d.Run(ctx)
	})
}

// boundShutdown runs f and returns its error; once ctx ends, it waits for f
// at most deadline, then returns without it.
func boundShutdown(ctx context.Context, deadline time.Duration, f func() error) error {
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	t := time.NewTimer(deadline)
	defer t.Stop()
	select {
	case err := <-done:
		return err
	case <-t.C:
		return fmt.Errorf("the shutdown did not finish within %s: exiting without it (something, such as a read of a hung volume, never returned)", deadline)
	}
}

// Daemon is an image server ready to run.
type Daemon struct {
	opts    Options
	log     *slog.Logger
	store   *imagestore.Store
	srv     *server.Server
	regs    *server.Registries
	inputs  server.Inputs
	refs    *metal3.References
	ln      net.Listener
	httpSrv *http.Server
	// With PeersService (replicas.go).
	replicas *replicas
	// limits are the server's bounds, which the fleet's needs share.
	limits server.Config
	// lastNeeds are the fleet's needs last used (fleetneeds.go).
	lastNeeds *fleet.FleetNeeds
}

// Open checks o and builds the server: the store is opened and the address
// listened on, but nothing is read or served before Run, which must follow.
func Open(o Options) (_ *Daemon, err error) {
	if (o.OSImages == "") == (o.OSImagesConfigMap == "") {
		return nil, exitcode.InputError(errors.New("give exactly one of --os-images and --os-images-configmap"))
	}
	if o.OutputFile != "" && o.OutputConfigMap != "" {
		return nil, exitcode.InputError(errors.New("give at most one of --output-file and --output-configmap"))
	}
	if (o.TLSCert == "") != (o.TLSKey == "") {
		return nil, exitcode.InputError(errors.New("--tls-cert and --tls-key go together"))
	}
	for _, f := range []struct{ flag, key string }{
		{"--os-images-configmap", o.OSImagesConfigMap}, {"--output-configmap", o.OutputConfigMap}, {"--fleet-needs-configmap", o.FleetNeeds.ConfigMap},
	} {
		if _, err := kube.ParseObjectKey(f.key); f.key != "" && err != nil {
			return nil, exitcode.InputError(fmt.Errorf("%s %w", f.flag, err))
		}
	}
	cfg, err := o.limits()
	if err != nil {
		return nil, exitcode.InputError(err)
	}
	if err := o.FleetNeeds.Check(); err != nil {
		return nil, exitcode.InputError(err)
	}
	log := o.Logger
	if log == nil {
		// Errors quote registry answers and input values: each is clipped.
		log = slog.New(clip.Handler(slog.NewJSONHandler(os.Stderr, nil), clip.LogValue))
	}
	d := &Daemon{opts: o, log: log, limits: cfg}
	defer func() {
		if err != nil {
			d.close()
		}
	}()
	if d.store, err = imagestore.Open(o.Data, imagestore.WithLogger(log)); err != nil {
		return nil, exitcode.InputError(fmt.Errorf("--data %s: %w", o.Data, err))
	}
	d.inputs = server.Inputs{OSImagesFile: o.OSImages, ValueFiles: o.ValueFiles, Poll: o.Poll, Logger: log}
	if o.OutputFile != "" {
		cfg.Publisher = server.FilePublisher{Path: o.OutputFile}
	}
	needsCluster := o.OSImagesConfigMap != "" || o.OutputConfigMap != "" || o.FleetNeeds.Serve
	if needsCluster {
		client, err := kube.Clientset(o.Kubeconfig)
		if err != nil {
			return nil, exitcode.InputError(err)
		}
		if err := d.inputsFromCluster(client, &cfg); err != nil {
			return nil, exitcode.InputError(err)
		}
	}
	clients, err := oci.NewClients(oci.Options{CAFile: o.Registry.CAFile, RegistryConfig: o.Registry.RegistryConfig, MaxConnsPerHost: o.Concurrency})
	if err != nil {
		return nil, exitcode.InputError(err)
	}
	d.regs = server.NewRegistries(clients, cfg.StallTimeout, log)
	if o.KeepReferenced {
		if d.refs, err = references(o.Kubeconfig, log); err != nil {
			if needsCluster {
				return nil, exitcode.InputError(err)
			}
			// Without a cluster there is no Metal3 object to reference an
			// image: files-only serving (a lab, the demo) needs no guard.
			log.Warn("reference-safe garbage collection is off: no cluster to read Metal3 objects from (--keep-referenced=false silences this)", "error", err.Error())
		}
	}
	if o.PeersService != "" {
		if d.replicas, err = openReplicas(o, log); err != nil {
			return nil, exitcode.InputError(err)
		}
		cfg.Replicas, cfg.PeerTimeout, cfg.ReportPeer = d.replicas.tracker, o.PeerTimeout, d.replicas.reportPeer
	}
	cfg.Store, cfg.Pull, cfg.Logger, cfg.Metrics = d.store, d.regs.Pull(), log, server.NewMetrics()
	cfg.AllowEmpty = o.AllowEmpty
	if d.refs != nil {
		cfg.References = d.refs
	}
	d.srv = server.New(cfg)
	d.inputs.Report = d.srv.ReportInputs
	d.inputs.Waiting = d.srv.WaitForCatalog

	if d.ln = o.Listener; d.ln == nil {
		if d.ln, err = net.Listen("tcp", o.Listen); err != nil {
			return nil, exitcode.InputError(fmt.Errorf("--listen %s: %w", o.Listen, err))
		}
	}
	d.httpSrv = d.srv.HTTPServer()
	if d.replicas != nil {
		d.replicas.srv = d.srv
	}
	return d, nil
}

// inputsFromCluster points the inputs and the publisher at the ConfigMaps
// of the options.
func (d *Daemon) inputsFromCluster(client kubernetes.Interface, cfg *server.Config) error {
	d.inputs.Client = client
	if d.opts.OSImagesConfigMap != "" {
		key, err := kube.ParseObjectKey(d.opts.OSImagesConfigMap)
		if err != nil {
			return fmt.Errorf("--os-images-configmap %w", err)
		}
		d.inputs.OSImagesConfigMap = &key
	}
	if err := d.fleetNeedsFromCluster(); err != nil {
		return err
	}
	if d.opts.OutputConfigMap != "" {
		key, err := kube.ParseObjectKey(d.opts.OutputConfigMap)
		if err != nil {
			return fmt.Errorf("--output-configmap %w", err)
		}
		cfg.Publisher = server.ConfigMapPublisher{Client: client, Key: key}
	}
	return nil
}

// Server is the image server the daemon runs.
func (d *Daemon) Server() *server.Server { return d.srv }

// Addr is the address the daemon serves on.
func (d *Daemon) Addr() net.Addr { return d.ln.Addr() }

func (d *Daemon) close() {
	if d.ln != nil && d.opts.Listener == nil {
		d.ln.Close()
	}
	if d.replicas != nil && d.replicas.ln != nil {
		d.replicas.ln.Close()
	}
	if d.store != nil {
		d.store.Close()
	}
}

// Run reads the inputs (again on SIGHUP), and pulls, serves and publishes
// until ctx ends; it closes the store. Inputs that cannot be used at start
// end it with an exitcode.InputError.
func (d *Daemon) Run(ctx context.Context) error {
	defer d.store.Close()
	log := d.log
	log.Info("serving", "address", d.ln.Addr().String(), "tls", d.opts.TLSCert != "", "data", d.opts.Data)

	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		err := d.inputs.Watch(gctx, hup, func(in server.Loaded) error { return d.apply(gctx, in) })
		var refused *server.RefusedError
		if errors.As(err, &refused) {
			// At start: there are no last good inputs to serve from.
			return exitcode.InputError(err)
		}
		return err
	})
	g.Go(func() error { return d.srv.Run(gctx) })
	if d.refs != nil {
		g.Go(func() error { d.refs.Run(gctx, time.Minute); return nil })
	}
	if d.replicas != nil {
		d.replicas.run(gctx, g)
	}
	g.Go(func() error {
		var err error
		if d.opts.TLSCert != "" {
			err = d.httpSrv.ServeTLS(d.ln, d.opts.TLSCert, d.opts.TLSKey)
		} else {
			err = d.httpSrv.Serve(d.ln)
		}
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return err
	})
	g.Go(func() error {
		<-gctx.Done()
		log.Info("shutting down", "grace", ShutdownGrace.String())
		shutdown, cancel := context.WithTimeout(context.Background(), ShutdownGrace)
		defer cancel()
		if err := d.httpSrv.Shutdown(shutdown); err != nil {
			// Responses still in flight (a client in the middle of an
			// image) are cut: the process must end.
			d.httpSrv.Close()
		}
		return nil
	})
	return g.Wait()
}

// MinScrubInterval is the shortest --scrub-interval but 0 (off). The scrub
// looks for bit rot, which takes days; an interval of nanoseconds re-read
// small images in a loop and logged each pass.
const MinScrubInterval = time.Minute

// apply puts new inputs in force, unless the server refuses their
// selection (Server.Admit): then nothing changes, registry settings
// included.
func (d *Daemon) apply(ctx context.Context, in server.Loaded) error {
	mgmt, selErr := selection.Select(in.Values, in.Catalog)
	wanted, refused := d.addFleetNeeds(in, mgmt)
	if err := d.srv.Admit(ctx, wanted); err != nil {
		// The fleet's needs never keep the management selection from
		// applying: when the set with them is refused and the set without
		// them is not, the needs wait.
		if len(wanted) == len(mgmt) || d.srv.Admit(ctx, mgmt) != nil {
			return err
		}
		d.log.Error("the fleet's needs are not served: with them, the served set would be refused; the management selection applies alone", "error", err.Error())
		wanted, refused = mgmt, needsLeftOut(wanted, mgmt, refused, err)
	}
	policyErr := d.regs.Apply(in.Values)
	if selErr != nil {
		d.log.Error("selection problems (the other images are still served)", "error", selErr)
	}
	d.srv.SetRefusedNeeds(refused)
	d.srv.SetDesired(wanted, errors.Join(selErr, policyErr))
	return nil
}

// limits checks the options that bound the server's work and returns them
// as a Config. Every value is used as given, zero included where it means
// something, or refused: none is replaced by a default behind the
// operator's back.
func (o Options) limits() (server.Config, error) {
	var errs []error
	if o.Concurrency < 1 {
		errs = append(errs, fmt.Errorf("--concurrency %d: at least one download must run at a time", o.Concurrency))
	}
	if o.GCGrace < 0 {
		errs = append(errs, fmt.Errorf("--gc-grace %s is negative: give 0 to delete deselected images at the next collection", o.GCGrace))
	}
	if o.Poll <= 0 {
		errs = append(errs, fmt.Errorf("--poll %s: the input files must be checked at a positive interval, such as 2s", o.Poll))
	}
	if o.StallTimeout <= 0 {
		errs = append(errs, fmt.Errorf("--stall-timeout %s: give a positive duration, such as 60s", o.StallTimeout))
	}
	maxStorage, err := kube.Quantity("--max-storage", o.MaxStorage)
	if err == nil && o.MaxStorage != "" && maxStorage <= 0 {
		err = fmt.Errorf("--max-storage %q: give a positive quantity such as 500Gi, or leave it out for no bound but the disk", o.MaxStorage)
	}
	errs = append(errs, err)
	margin, err := kube.Quantity("--free-space-margin", o.FreeSpaceMargin)
	if err == nil && margin < 0 {
		err = fmt.Errorf("--free-space-margin %q is negative: give 0 for no margin", o.FreeSpaceMargin)
	}
	errs = append(errs, err)
	maxImage, err := kube.Quantity("--max-image-size", o.MaxImageSize)
	if err == nil && maxImage <= 0 {
		err = fmt.Errorf("--max-image-size %q: give a positive quantity such as 64Gi", o.MaxImageSize)
	}
	errs = append(errs, err)
	minRate, err := kube.Quantity("--min-rate", o.MinRate)
	if err == nil && minRate < 0 {
		err = fmt.Errorf("--min-rate %q is negative: give 0 for downloads never to give way", o.MinRate)
	}
	errs = append(errs, err)
	if o.PeerTimeout < 0 {
		errs = append(errs, fmt.Errorf("--peer-timeout %s is negative: give how long a peer may show no progress, such as 30s", o.PeerTimeout))
	}
	if o.ScrubInterval < 0 {
		errs = append(errs, fmt.Errorf("--scrub-interval %s is negative: give 0 to switch the scrub off", o.ScrubInterval))
	} else if o.ScrubInterval > 0 && o.ScrubInterval < MinScrubInterval {
		errs = append(errs, fmt.Errorf("--scrub-interval %s is below the minimum of %s: a scrub re-reads each stored image once per interval, and more often only fills the log; give at least %s (the default is %s), or 0 to switch the scrub off",
			o.ScrubInterval, MinScrubInterval, MinScrubInterval, server.DefaultScrubInterval))
	}
	scrubRate, err := kube.Quantity("--scrub-rate", o.ScrubRate)
	if err == nil && scrubRate <= 0 {
		err = fmt.Errorf("--scrub-rate %q: give a positive quantity of bytes per second such as 50Mi (--scrub-interval 0 switches the scrub off)", o.ScrubRate)
	}
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return server.Config{}, err
	}
	return server.Config{
		Concurrency: o.Concurrency, GCGrace: o.GCGrace, MaxStorage: maxStorage, FreeSpaceMargin: margin,
		MaxImageSize: maxImage, StallTimeout: o.StallTimeout, MinRate: minRate,
		ScrubInterval: o.ScrubInterval, ScrubRate: scrubRate,
	}, nil
}

// references returns the tracker of the Metal3 objects that reference
// images, over the cluster of kubeconfig.
func references(kubeconfig string, log *slog.Logger) (*metal3.References, error) {
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
