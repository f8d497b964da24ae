package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/sylva-projects/osimages/internal/clip"
	"github.com/sylva-projects/osimages/internal/daemon"
	"github.com/sylva-projects/osimages/internal/exitcode"
	"github.com/sylva-projects/osimages/internal/imagehttp"
	"github.com/sylva-projects/osimages/internal/kube"
	"github.com/sylva-projects/osimages/internal/oci"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/replica"
	"github.com/sylva-projects/osimages/internal/server"
)

// serveOptions are the flags of `osimages serve`.
type serveOptions struct {
	data, listen                string
	osImages, osImagesConfigMap string
	kubeconfig                  string
	valueFiles                  []string
	outputFile, outputConfigMap string
	concurrency                 int
	gcGrace                     time.Duration
	// maxStorage, freeSpaceMargin, maxImageSize, minRate and scrubRate
	// are quantities, such as 200Gi; maxStorage "" is no bound but the
	// disk.
	maxStorage, freeSpaceMargin, maxImageSize, minRate, scrubRate string
	stallTimeout, scrubInterval, clientHold                       time.Duration
	tlsCert, tlsKey                                               string
	registry                                                      oci.Options
	poll                                                          time.Duration
	allowEmpty, keepReferenced                                    bool
	fleetNeeds                                                    fleetNeedsFlags
	fleetNeedsConfigMap                                           string
	replicaID, peersService, peerListen, publisherLease           string
	peerTimeout, claimWait                                        time.Duration
	expectedReplicas                                              int
}

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
		RunE: func(cmd *cobra.Command, _ []string) error { return runServe(cmd.Context(), o, cmd.ErrOrStderr()) },
	}
	f := cmd.Flags()
	f.StringVar(&o.data, "data", "", "data directory holding the stored images")
	f.StringVar(&o.listen, "listen", ":8080", "address to serve HTTP(S) on")
	f.StringVar(&o.osImages, "os-images", "", "os_images document or os-images-info ConfigMap manifest")
	f.StringVar(&o.osImagesConfigMap, "os-images-configmap", "", "read and watch os_images from this ConfigMap, NS/NAME")
	addKubeconfigFlag(f, &o.kubeconfig)
	f.StringArrayVarP(&o.valueFiles, "values", "f", nil, "management cluster values; repeat to merge several, later wins")
	f.StringVar(&o.outputFile, "output-file", "", "write the served-images document to this file, and the OCI references of the available images beside it (FILE with -oci before its extension: served.yaml, served-oci.yaml)")
	f.StringVar(&o.outputConfigMap, "output-configmap", "", "apply the served-images ConfigMap, NS/NAME (Sylva: "+osimage.ServedConfigMapNamespace+"/"+osimage.ServedConfigMapName+")")
	f.IntVar(&o.concurrency, "concurrency", server.DefaultConcurrency, "downloads at once")
	f.DurationVar(&o.gcGrace, "gc-grace", server.DefaultGCGrace, "how long a deselected image stays on disk before it is deleted (0: at the next collection)")
	f.StringVar(&o.maxStorage, "max-storage", "", "bound on the bytes of stored images and downloads, as a quantity such as 200Gi (default: the disk)")
	f.StringVar(&o.freeSpaceMargin, "free-space-margin", "1Gi", "free disk space kept besides what downloads reserve (0: none)")
	f.StringVar(&o.maxImageSize, "max-image-size", "64Gi", "largest image file: the bound of an image that declares no size (reserved on disk for its download), and the most an image may declare")
	f.DurationVar(&o.stallTimeout, "stall-timeout", server.DefaultStallTimeout, "a download that receives no byte for this long (manifest included) is cut and retried with backoff; it is also the window of --min-rate")
	f.StringVar(&o.minRate, "min-rate", "64Ki", "bytes per second below which a download, measured over --stall-timeout, gives way to images waiting for a slot, and a fill from a peer replica is given up for another source (0: never)")
	f.DurationVar(&o.scrubInterval, "scrub-interval", server.DefaultScrubInterval, "how often each stored image is re-read and re-hashed, counted from its last check (kept across restarts); one found changed is no longer served and is downloaded again (at least 1m; 0: never)")
	f.StringVar(&o.scrubRate, "scrub-rate", "50Mi", "bytes per second the scrub reads at most, one image at a time")
	f.StringVar(&o.tlsCert, "tls-cert", "", "serve HTTPS with this certificate (PEM)")
	f.StringVar(&o.tlsKey, "tls-key", "", "private key of --tls-cert (PEM)")
	f.DurationVar(&o.poll, "poll", 2*time.Second, "how often input files are checked for changes")
	f.BoolVar(&o.allowEmpty, "allow-empty", false, "accept inputs that select no image while images are served, to empty the served set on purpose (refused otherwise, and the last good inputs stay in force)")
	f.BoolVar(&o.keepReferenced, "keep-referenced", true, "never delete, and keep serving, a deselected image that a Metal3MachineTemplate or Metal3Machine still references (needs list/watch on them cluster-wide)")
	f.StringVar(&o.replicaID, "replica-id", "", "this replica's ID among the --peers-service endpoints, as their targetRef names it (default: $POD_NAME, else the hostname)")
	f.StringVar(&o.peersService, "peers-service", "", "headless Service whose ready EndpointSlice endpoints are the other replicas: images are filled from peers first, one replica per image pulls from the registry, and the holder of --publisher-lease publishes (empty: one replica)")
	f.StringVar(&o.peerListen, "peer-listen", daemon.DefaultPeerListen, "address of the peer-only listener (EndpointSlice port \"peer\"): images, in progress too, and the replica's state; expose it only through the headless Service")
	f.DurationVar(&o.peerTimeout, "peer-timeout", replica.DefaultPeerTimeout, "a peer that shows no progress for this long is skipped, and the next replica in rendezvous order pulls the image")
	f.DurationVar(&o.clientHold, "client-hold", imagehttp.DefaultHold, "how long a client's request for a selected image that no replica holds verified yet waits for one before it is answered 503 with Retry-After (0: at once); with --peers-service, a whole GET or HEAD of one a peer holds verified is answered from that peer's copy, the relay bounded by this hold too, while a range or a conditional request waits for the copy verified here")
	f.IntVar(&o.expectedReplicas, "replicas", 0, "with --peers-service, how many replicas the set should have (the chart gives server.replicas): a replica claims no download before it lists that many, itself included, or --claim-wait has passed since it first read its peers, so that replicas started together do not each pull what one pulls (0: unknown, a replica that lists no other waits --claim-wait)")
	f.DurationVar(&o.claimWait, "claim-wait", replica.DefaultClaimWait, "with --peers-service, how long after its first read of the peers a replica that lists fewer than --replicas claims downloads anyway")
	f.StringVar(&o.publisherLease, "publisher-lease", daemon.DefaultPublisherLease, "Lease, in the server's namespace ($POD_NAMESPACE), that elects the replica that writes --output-configmap")
	addFleetNeedsFlags(f, &o.fleetNeeds, "also serve")
	f.StringVar(&o.fleetNeedsConfigMap, "fleet-needs-configmap", "", "with --serve-fleet-needs, the fleet's needs, NS/NAME (default: "+osimage.FleetNeedsConfigMapName+" in the namespace of --os-images-configmap or --output-configmap)")
	addRegistryFlags(f, &o.registry)
	_ = cmd.MarkFlagRequired("data")
	_ = cmd.MarkFlagRequired("values")
	return cmd
}

// runServe checks o, then serves until ctx ends, logging JSON to stderr.
// Wrong flags, and what they name when it cannot be used at start (the
// data directory, an address, the inputs), exit 2; a server that fails
// later 1.
func runServe(ctx context.Context, o serveOptions, stderr io.Writer) error {
	opts, err := o.options()
	if err != nil {
		return exitcode.InputError(err)
	}
	if opts.Listener, err = net.Listen("tcp", o.listen); err != nil {
		return exitcode.InputError(fmt.Errorf("--listen %s: %w", o.listen, err))
	}
	defer opts.Listener.Close()
	if opts.PeersService != "" {
		if opts.PeerListener, err = net.Listen("tcp", o.peerListen); err != nil {
			return exitcode.InputError(fmt.Errorf("--peer-listen %s: %w", o.peerListen, err))
		}
		defer opts.PeerListener.Close()
	}
	// Errors quote registry answers and input values: each is clipped.
	opts.Logger = slog.New(clip.Handler(slog.NewJSONHandler(stderr, nil), clip.LogValue))
	err = daemon.Run(ctx, opts)
	var dataDir *daemon.DataDirError
	if errors.As(err, &dataDir) {
		return exitcode.InputError(fmt.Errorf("--data %s: %w", dataDir.Dir, dataDir.Err))
	}
	var start *daemon.StartError
	if errors.As(err, &start) {
		return exitcode.InputError(err)
	}
	return err
}

// options checks the flags that need nothing but themselves, and returns
// the daemon's options they give (but the listeners and the logger).
// Every value is used as given, zero included where it means something,
// or refused: none is replaced by a default behind the operator's back.
func (o serveOptions) options() (daemon.Options, error) {
	if (o.osImages == "") == (o.osImagesConfigMap == "") {
		return daemon.Options{}, errors.New("give exactly one of --os-images and --os-images-configmap")
	}
	if o.outputFile != "" && o.outputConfigMap != "" {
		return daemon.Options{}, errors.New("give at most one of --output-file and --output-configmap")
	}
	if (o.tlsCert == "") != (o.tlsKey == "") {
		return daemon.Options{}, errors.New("--tls-cert and --tls-key go together")
	}
	opts := daemon.Options{
		Data: o.data, OSImages: o.osImages, Kubeconfig: o.kubeconfig, ValueFiles: o.valueFiles, OutputFile: o.outputFile,
		TLSCert: o.tlsCert, TLSKey: o.tlsKey, Registry: o.registry, Poll: o.poll,
		AllowEmpty: o.allowEmpty, KeepReferenced: o.keepReferenced,
		ReplicaID: o.replicaID, PeersService: o.peersService, PublisherLease: o.publisherLease, PeerTimeout: o.peerTimeout,
		ClaimRule: replica.ClaimRule{Replicas: o.expectedReplicas, Wait: o.claimWait},
	}
	for _, f := range []struct {
		flag, value string
		key         **kube.ObjectKey
	}{
		{"--os-images-configmap", o.osImagesConfigMap, &opts.OSImagesConfigMap},
		{"--output-configmap", o.outputConfigMap, &opts.OutputConfigMap},
		{"--fleet-needs-configmap", o.fleetNeedsConfigMap, nil},
	} {
		if f.value == "" {
			continue
		}
		key, err := kube.ParseObjectKey(f.value)
		if err != nil {
			return daemon.Options{}, fmt.Errorf("%s %w", f.flag, err)
		}
		if f.key != nil {
			*f.key = &key
		}
	}
	var err error
	if opts.Limits, err = o.limits(); err != nil {
		return daemon.Options{}, err
	}
	policy, err := o.fleetNeeds.policy()
	if err != nil {
		return daemon.Options{}, err
	}
	if o.fleetNeeds.serve {
		key, err := o.fleetNeedsKey(opts)
		if err != nil {
			return daemon.Options{}, err
		}
		opts.FleetNeeds = &daemon.FleetNeedsOptions{ConfigMap: key, Policy: policy}
	}
	if o.peersService != "" {
		if opts.ReplicaID, err = o.replicas(); err != nil {
			return daemon.Options{}, err
		}
	}
	return opts, nil
}

// fleetNeedsKey is --fleet-needs-configmap, or by default the fleet-needs
// ConfigMap in the namespace of the server's other ConfigMaps.
func (o serveOptions) fleetNeedsKey(opts daemon.Options) (kube.ObjectKey, error) {
	if o.fleetNeedsConfigMap != "" {
		return kube.ParseObjectKey(o.fleetNeedsConfigMap)
	}
	for _, other := range []*kube.ObjectKey{opts.OSImagesConfigMap, opts.OutputConfigMap} {
		if other != nil {
			return kube.ObjectKey{Namespace: other.Namespace, Name: osimage.FleetNeedsConfigMapName}, nil
		}
	}
	return kube.ObjectKey{}, errors.New("--serve-fleet-needs: give --fleet-needs-configmap NS/NAME (no --os-images-configmap or --output-configmap names the server's namespace)")
}

// replicas checks the flags of a server behind --peers-service and
// returns this replica's ID.
func (o serveOptions) replicas() (string, error) {
	if o.outputFile != "" {
		return "", errors.New("--peers-service needs --output-configmap: replicas publish one ConfigMap through an elected leader, not a file each")
	}
	if o.peerTimeout <= 0 {
		return "", fmt.Errorf("--peer-timeout %s: give a positive duration, such as 30s", o.peerTimeout)
	}
	if o.expectedReplicas < 0 {
		return "", fmt.Errorf("--replicas %d is negative: give how many replicas the set should have, or 0 when unknown", o.expectedReplicas)
	}
	if o.claimWait <= 0 {
		return "", fmt.Errorf("--claim-wait %s: give a positive duration, such as 10s", o.claimWait)
	}
	id := o.replicaID
	if id == "" {
		id = os.Getenv("POD_NAME")
	}
	if id == "" {
		h, err := os.Hostname()
		if err != nil {
			return "", fmt.Errorf("--replica-id is empty, POD_NAME is not set and the hostname cannot be read (%v): give --replica-id", err)
		}
		id = h
	}
	return id, nil
}

// limits checks the flags that bound the server's work and returns them
// as the server's Config.
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
	maxStorage, err := kube.Quantity("--max-storage", o.maxStorage)
	if err == nil && o.maxStorage != "" && maxStorage <= 0 {
		err = fmt.Errorf("--max-storage %q: give a positive quantity such as 500Gi, or leave it out for no bound but the disk", o.maxStorage)
	}
	errs = append(errs, err)
	margin, err := kube.Quantity("--free-space-margin", o.freeSpaceMargin)
	if err == nil && margin < 0 {
		err = fmt.Errorf("--free-space-margin %q is negative: give 0 for no margin", o.freeSpaceMargin)
	}
	errs = append(errs, err)
	maxImage, err := kube.Quantity("--max-image-size", o.maxImageSize)
	if err == nil && maxImage <= 0 {
		err = fmt.Errorf("--max-image-size %q: give a positive quantity such as 64Gi", o.maxImageSize)
	}
	errs = append(errs, err)
	minRate, err := kube.Quantity("--min-rate", o.minRate)
	if err == nil && minRate < 0 {
		err = fmt.Errorf("--min-rate %q is negative: give 0 for downloads never to give way", o.minRate)
	}
	errs = append(errs, err)
	if o.clientHold < 0 {
		errs = append(errs, fmt.Errorf("--client-hold %s is negative: give how long a request for an image not verified yet may wait, such as 20s, or 0 to answer at once", o.clientHold))
	}
	if o.peerTimeout < 0 {
		errs = append(errs, fmt.Errorf("--peer-timeout %s is negative: give how long a peer may show no progress, such as 30s", o.peerTimeout))
	}
	if o.scrubInterval < 0 {
		errs = append(errs, fmt.Errorf("--scrub-interval %s is negative: give 0 to switch the scrub off", o.scrubInterval))
	} else if o.scrubInterval > 0 && o.scrubInterval < server.MinScrubInterval {
		errs = append(errs, fmt.Errorf("--scrub-interval %s is below the minimum of %s: a scrub re-reads each stored image once per interval, and more often only fills the log; give at least %s (the default is %s), or 0 to switch the scrub off",
			o.scrubInterval, server.MinScrubInterval, server.MinScrubInterval, server.DefaultScrubInterval))
	}
	scrubRate, err := kube.Quantity("--scrub-rate", o.scrubRate)
	if err == nil && scrubRate <= 0 {
		err = fmt.Errorf("--scrub-rate %q: give a positive quantity of bytes per second such as 50Mi (--scrub-interval 0 switches the scrub off)", o.scrubRate)
	}
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return server.Config{}, err
	}
	return server.Config{
		Concurrency: o.concurrency, GCGrace: o.gcGrace, MaxStorage: maxStorage, FreeSpaceMargin: margin,
		MaxImageSize: maxImage, StallTimeout: o.stallTimeout, MinRate: minRate,
		ScrubInterval: o.scrubInterval, ScrubRate: scrubRate, ClientHold: o.clientHold,
	}, nil
}
