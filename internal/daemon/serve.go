// Package daemon runs the image server of the management cluster as the
// `osimages serve` command does: it opens the store, watches the inputs,
// applies their selection and registry settings to a server.Server,
// publishes what is served, guards referenced images, and serves HTTP
// until its context ends. The demo runs it too.
package daemon

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

	"github.com/sylva-projects/osimages/internal/fill"
	"github.com/sylva-projects/osimages/internal/imagehttp"
	"github.com/sylva-projects/osimages/internal/imagestore"
	"github.com/sylva-projects/osimages/internal/kube"
	"github.com/sylva-projects/osimages/internal/metal3"
	"github.com/sylva-projects/osimages/internal/oci"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/replica"
	"github.com/sylva-projects/osimages/internal/servedset"
	"github.com/sylva-projects/osimages/internal/server"
	"github.com/sylva-projects/osimages/internal/serverio"
)

// Options are what `osimages serve` runs with, checked and parsed by the
// command: the daemon uses each as given.
type Options struct {
	Data string
	// Listener is where HTTP is served; the caller opens and closes it.
	Listener net.Listener
	// OSImages is an os_images document or an os-images-info ConfigMap
	// manifest; OSImagesConfigMap, when set, is read and watched instead.
	OSImages          string
	OSImagesConfigMap *kube.ObjectKey
	Kubeconfig        string
	ValueFiles        []string
	// OutputFile or OutputConfigMap, when set, gets the served set.
	OutputFile      string
	OutputConfigMap *kube.ObjectKey
	// Limits are the bounds of the server's work: its Concurrency,
	// GCGrace, MaxStorage (0: the disk), FreeSpaceMargin, MaxImageSize,
	// StallTimeout, MinRate, ScrubInterval (0: never) and ScrubRate. Open
	// sets the rest of the server's Config.
	Limits          server.Config
	TLSCert, TLSKey string
	// Registry is how registries are reached (CA, credentials); the
	// values choose whether TLS is verified.
	Registry       oci.Options
	Poll           time.Duration
	AllowEmpty     bool
	KeepReferenced bool
	// FleetNeeds, when set, adds the images the fleet needs, within its
	// policy (fleetneeds.go).
	FleetNeeds *FleetNeedsOptions
	// Logger gets the server's log; nil discards it.
	Logger *slog.Logger

	// Replicas (replicas.go): PeersService, when set, is the headless
	// Service whose ready endpoints are the other replicas; ReplicaID
	// names this one; PeerListener is the peer-only listener, which the
	// caller opens and closes; a replica that shows no progress for
	// PeerTimeout is taken over; the Lease PublisherLease elects the one
	// that publishes, to OutputConfigMap.
	ReplicaID, PeersService, PublisherLease string
	PeerListener                            net.Listener
	PeerTimeout                             time.Duration
	// ClaimRule says when a replica starts claiming downloads: once it
	// lists the replicas it expects, or after a bounded wait.
	ClaimRule replica.ClaimRule
}

// StartError is an error that keeps the server from starting: an option,
// or what it names (the data directory, the cluster, the inputs at start),
// cannot be used. Other errors of Run are failures of the work.
type StartError struct{ Err error }

func (e *StartError) Error() string { return e.Err.Error() }
func (e *StartError) Unwrap() error { return e.Err }

// DataDirError says that the data directory cannot hold the store.
type DataDirError struct {
	Dir string
	Err error
}

func (e *DataDirError) Error() string { return fmt.Sprintf("data directory %s: %v", e.Dir, e.Err) }
func (e *DataDirError) Unwrap() error { return e.Err }

// startError marks err as a StartError; nil stays nil.
func startError(err error) error {
	if err == nil {
		return nil
	}
	return &StartError{Err: err}
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

// Run serves until ctx ends. Options, and inputs, that cannot be used at
// start are a *StartError. Once ctx ends, Run returns within
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
	regs    *fill.Registries
	inputs  serverio.Inputs
	refs    *metal3.References
	ln      net.Listener
	httpSrv *http.Server
	// With PeersService (replicas.go).
	replicas *replicas
	// limits are the server's bounds, which the fleet's needs share.
	limits server.Config
	// lastNeeds are the fleet's needs last used (fleetneeds.go).
	lastNeeds *osimage.FleetNeeds
}

// Open builds the server: the store is opened, but nothing is read or
// served before Run, which must follow. Its errors are *StartError.
func Open(o Options) (*Daemon, error) {
	d, err := open(o)
	return d, startError(err)
}

func open(o Options) (_ *Daemon, err error) {
	if o.Listener == nil {
		return nil, errors.New("no listener to serve HTTP on")
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	cfg := o.Limits
	d := &Daemon{opts: o, log: log, ln: o.Listener, limits: cfg}
	defer func() {
		if err != nil {
			d.close()
		}
	}()
	if d.store, err = imagestore.Open(o.Data, imagestore.WithLogger(log)); err != nil {
		return nil, &DataDirError{Dir: o.Data, Err: err}
	}
	d.inputs = serverio.Inputs{OSImagesFile: o.OSImages, ValueFiles: o.ValueFiles, Poll: o.Poll, Logger: log}
	if o.OutputFile != "" {
		cfg.Publisher = serverio.FilePublisher{Path: o.OutputFile}
	}
	needsCluster := o.OSImagesConfigMap != nil || o.OutputConfigMap != nil || o.FleetNeeds != nil
	if needsCluster {
		client, err := kube.Clientset(o.Kubeconfig)
		if err != nil {
			return nil, err
		}
		d.inputsFromCluster(client, &cfg)
	}
	clients, err := oci.NewClients(oci.Options{CAFile: o.Registry.CAFile, RegistryConfig: o.Registry.RegistryConfig, MaxConnsPerHost: cfg.Concurrency})
	if err != nil {
		return nil, err
	}
	d.regs = fill.NewRegistries(clients, cfg.StallTimeout, log)
	if o.KeepReferenced {
		if d.refs, err = references(o.Kubeconfig, log); err != nil {
			if needsCluster {
				return nil, err
			}
			// Without a cluster there is no Metal3 object to reference an
			// image: files-only serving (a lab, the demo) needs no guard.
			log.Warn("reference-safe garbage collection is off: no cluster to read Metal3 objects from (--keep-referenced=false silences this)", "error", err.Error())
		}
	}
	if o.PeersService != "" {
		if d.replicas, err = openReplicas(o, log); err != nil {
			return nil, err
		}
		cfg.Replicas, cfg.PeerTimeout, cfg.ReportPeer, cfg.ClaimRule = d.replicas.tracker, o.PeerTimeout, d.replicas.reportPeer, o.ClaimRule
	}
	cfg.Store, cfg.Pull, cfg.Logger, cfg.Metrics = d.store, d.regs.Fill(), log, imagehttp.NewMetrics()
	cfg.AllowEmpty = o.AllowEmpty
	if d.refs != nil {
		cfg.References = d.refs
	}
	d.srv = server.New(cfg)
	d.inputs.Report = d.srv.ReportInputs
	d.inputs.Waiting = d.srv.WaitForCatalog
	d.httpSrv = d.srv.HTTPServer()
	if d.replicas != nil {
		d.replicas.srv = d.srv
	}
	return d, nil
}

// inputsFromCluster points the inputs and the publisher at the ConfigMaps
// of the options.
func (d *Daemon) inputsFromCluster(client kube.Client, cfg *server.Config) {
	d.inputs.Client = client
	d.inputs.OSImagesConfigMap = d.opts.OSImagesConfigMap
	d.fleetNeedsFromCluster()
	if key := d.opts.OutputConfigMap; key != nil {
		cfg.Publisher = serverio.ConfigMapPublisher{Client: client, Key: *key}
	}
}

// Server is the image server the daemon runs.
func (d *Daemon) Server() *server.Server { return d.srv }

func (d *Daemon) close() {
	if d.store != nil {
		d.store.Close()
	}
}

// Run reads the inputs (again on SIGHUP), and pulls, serves and publishes
// until ctx ends; it closes the store. Inputs that cannot be used at start
// end it with a *StartError.
func (d *Daemon) Run(ctx context.Context) error {
	defer d.store.Close()
	log := d.log
	log.Info("serving", "address", d.ln.Addr().String(), "tls", d.opts.TLSCert != "", "data", d.opts.Data)

	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		err := d.inputs.Watch(gctx, hup, func(in serverio.Loaded) error { return d.apply(gctx, in) })
		var refused *serverio.RefusedError
		if errors.As(err, &refused) {
			// At start: there are no last good inputs to serve from.
			return startError(err)
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

// apply puts new inputs in force, unless the server refuses their
// selection (Server.Admit): then nothing changes, registry settings
// included.
func (d *Daemon) apply(ctx context.Context, in serverio.Loaded) error {
	mgmt, selErr := servedset.Select(in.Values, in.Catalog)
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
