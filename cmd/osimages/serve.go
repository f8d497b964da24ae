package main

import (
	"time"

	"github.com/spf13/cobra"

	"github.com/sylva-projects/osimages/internal/fleet"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/serve"
	"github.com/sylva-projects/osimages/internal/server"
)

func newServeCommand() *cobra.Command {
	o := serve.Options{}
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
		RunE: func(cmd *cobra.Command, _ []string) error { return serve.Run(cmd.Context(), o) },
	}
	f := cmd.Flags()
	f.StringVar(&o.Data, "data", "", "data directory holding the stored images")
	f.StringVar(&o.Listen, "listen", ":8080", "address to serve HTTP(S) on")
	f.StringVar(&o.OSImages, "os-images", "", "os_images document or os-images-info ConfigMap manifest")
	f.StringVar(&o.OSImagesConfigMap, "os-images-configmap", "", "read and watch os_images from this ConfigMap, NS/NAME")
	addKubeconfigFlag(f, &o.Kubeconfig)
	f.StringArrayVarP(&o.ValueFiles, "values", "f", nil, "management cluster values; repeat to merge several, later wins")
	f.StringVar(&o.OutputFile, "output-file", "", "write the served-images document to this file")
	f.StringVar(&o.OutputConfigMap, "output-configmap", "", "apply the served-images ConfigMap, NS/NAME (Sylva: "+osimage.ServedConfigMapNamespace+"/"+osimage.ServedConfigMapName+")")
	f.IntVar(&o.Concurrency, "concurrency", server.DefaultConcurrency, "downloads at once")
	f.DurationVar(&o.GCGrace, "gc-grace", server.DefaultGCGrace, "how long a deselected image stays on disk before it is deleted (0: at the next collection)")
	f.StringVar(&o.MaxStorage, "max-storage", "", "bound on the bytes of stored images and downloads, as a quantity such as 200Gi (default: the disk)")
	f.StringVar(&o.FreeSpaceMargin, "free-space-margin", "1Gi", "free disk space kept besides what downloads reserve (0: none)")
	f.StringVar(&o.MaxImageSize, "max-image-size", "64Gi", "largest image file: the bound of an image that declares no size (reserved on disk for its download), and the most an image may declare")
	f.DurationVar(&o.StallTimeout, "stall-timeout", server.DefaultStallTimeout, "a download that receives no byte for this long (manifest included) is cut and retried with backoff; it is also the window of --min-rate")
	f.StringVar(&o.MinRate, "min-rate", "64Ki", "bytes per second below which a download, measured over --stall-timeout, gives way to images waiting for a slot, and a fill from a peer replica is given up for another source (0: never)")
	f.DurationVar(&o.ScrubInterval, "scrub-interval", server.DefaultScrubInterval, "how often each stored image is re-read and re-hashed, counted from its last check (kept across restarts); one found changed is no longer served and is downloaded again (at least 1m; 0: never)")
	f.StringVar(&o.ScrubRate, "scrub-rate", "50Mi", "bytes per second the scrub reads at most, one image at a time")
	f.StringVar(&o.TLSCert, "tls-cert", "", "serve HTTPS with this certificate (PEM)")
	f.StringVar(&o.TLSKey, "tls-key", "", "private key of --tls-cert (PEM)")
	f.DurationVar(&o.Poll, "poll", 2*time.Second, "how often input files are checked for changes")
	f.BoolVar(&o.AllowEmpty, "allow-empty", false, "accept inputs that select no image while images are served, to empty the served set on purpose (refused otherwise, and the last good inputs stay in force)")
	f.BoolVar(&o.KeepReferenced, "keep-referenced", true, "never delete, and keep serving, a deselected image that a Metal3MachineTemplate or Metal3Machine still references (needs list/watch on them cluster-wide)")
	f.StringVar(&o.ReplicaID, "replica-id", "", "this replica's ID among the --peers-service endpoints, as their targetRef names it (default: $POD_NAME, else the hostname)")
	f.StringVar(&o.PeersService, "peers-service", "", "headless Service whose ready EndpointSlice endpoints are the other replicas: images are filled from peers first, one replica per image pulls from the registry, and the holder of --publisher-lease publishes (empty: one replica)")
	f.StringVar(&o.PeerListen, "peer-listen", serve.DefaultPeerListen, "address of the peer-only listener (EndpointSlice port \"peer\"): images, in progress too, and the replica's state; expose it only through the headless Service")
	f.DurationVar(&o.PeerTimeout, "peer-timeout", server.DefaultPeerTimeout, "a peer that shows no progress for this long is skipped, and the next replica in rendezvous order pulls the image")
	f.StringVar(&o.PublisherLease, "publisher-lease", serve.DefaultPublisherLease, "Lease, in the server's namespace ($POD_NAMESPACE), that elects the replica that writes --output-configmap")
	addFleetNeedsFlags(f, &o.FleetNeeds.FleetOptions, "also serve")
	f.StringVar(&o.FleetNeeds.ConfigMap, "fleet-needs-configmap", "", "with --serve-fleet-needs, the fleet's needs, NS/NAME (default: "+fleet.FleetNeedsConfigMapName+" in the namespace of --os-images-configmap or --output-configmap)")
	addRegistryFlags(f, &o.Registry)
	_ = cmd.MarkFlagRequired("data")
	_ = cmd.MarkFlagRequired("values")
	return cmd
}
