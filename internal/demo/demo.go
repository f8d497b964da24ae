// Package demo is the embedded default: a complete run of osimages with no
// cluster and no outside registry. It publishes a few small generated
// diskimage-builder artifacts into an in-process registry on 127.0.0.1 and
// runs the catalog on them, serves the images the management cluster selects
// on 127.0.0.1, then renders a sample workload cluster's
// Metal3MachineTemplates from that catalog, checked against what is served.
package demo

import (
	"bytes"
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"sigs.k8s.io/yaml"

	"github.com/sylva-projects/osimages/internal/capm3"
	"github.com/sylva-projects/osimages/internal/catalog"
	imageserver "github.com/sylva-projects/osimages/internal/daemon"
	"github.com/sylva-projects/osimages/internal/devregistry"
	"github.com/sylva-projects/osimages/internal/oci"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/server"
	"github.com/sylva-projects/osimages/internal/signature"
	"github.com/sylva-projects/osimages/internal/values"
)

//go:embed values.yaml
var valuesYAML []byte

//go:embed cluster.yaml
var clusterYAML []byte

//go:embed mgmt.yaml
var mgmtYAML []byte

// Images are the artifacts the demo publishes, as diskimage-builder would.
var Images = []struct {
	Name   string
	Fields osimage.Image
}{
	{"ubuntu-noble-plain-rke2-1-32", dib("ubuntu", "noble", "plain", "rke2", "1.32.5+rke2r1")},
	{"ubuntu-noble-hardened-rke2-1-32", dib("ubuntu", "noble", "hardened", "rke2", "1.32.5+rke2r1")},
	{"ubuntu-noble-plain-kubeadm-1-32", dib("ubuntu", "noble", "plain", "kubeadm", "1.32.5")},
	{"leapmicro-6-0-plain-rke2-1-31", dib("leapmicro", "6.0", "plain", "rke2", "1.31.9+rke2r1")},
}

func dib(os, release, flavor, k8sFlavor, k8sVersion string) osimage.Image {
	hardened := "false"
	if flavor == "hardened" {
		hardened = "true"
	}
	return osimage.Image{
		osimage.FieldOS: os, osimage.FieldOSRelease: release,
		osimage.FieldFlavor: flavor, osimage.FieldHardened: hardened,
		osimage.FieldK8sFlavor: k8sFlavor, osimage.FieldK8sVersion: k8sVersion,
		osimage.FieldCommitID: "3f1c2a9e", osimage.FieldCommitTag: "0.7.6",
	}
}

// ImageSize is the size of each generated image file.
const ImageSize = 2 << 20

// Environment is a running demo registry holding the demo images.
type Environment struct {
	Registry *devregistry.Registry
	// Values are the demo's sylva-units values, pointing at Registry.
	Values values.Values
}

// Start publishes the demo images into a new in-process registry.
func Start(ctx context.Context) (*Environment, error) {
	reg, err := devregistry.Start(ctx, devregistry.Options{})
	if err != nil {
		return nil, err
	}
	vals, err := values.Parse(valuesYAML)
	if err != nil {
		reg.Close()
		return nil, fmt.Errorf("embedded demo values: %w", err)
	}
	vals["sylva_base_oci_registry"] = "oci://" + reg.Host + "/sylva-projects"
	vals["oci_registry_insecure"] = true
	// The artifacts are signed as diskimage-builder's CI signs them (cosign,
	// key-based), and the registry carries the public key, so that the demo
	// verifies signatures in the catalog and the image server.
	signer, err := devregistry.NewSigner()
	if err != nil {
		reg.Close()
		return nil, err
	}
	if regs, ok := vals["os_images_oci_registries"].(map[string]any); ok {
		if sylva, ok := regs["sylva"].(map[string]any); ok {
			sylva["cosign_publickey"] = signer.PublicKeyPEM
		}
	}
	tag, _ := vals["sylva_diskimagebuilder_version"].(string)
	for i, img := range Images {
		repo := "sylva-projects/sylva-elements/diskimage-builder/" + img.Name
		p, err := reg.Publish(ctx, devregistry.DiskImage{
			Repository: repo,
			Tag:        tag,
			Content:    devregistry.DiskContent(ImageSize, uint64(i+1)),
			Gzip:       true,
			Fields:     img.Fields,
		})
		if err == nil {
			err = reg.Sign(ctx, signer, repo, p.ManifestDigest, devregistry.SignOptions{})
		}
		if err != nil {
			reg.Close()
			return nil, fmt.Errorf("publishing demo image %s: %w", img.Name, err)
		}
	}
	return &Environment{Registry: reg, Values: vals}, nil
}

// Close stops the registry.
func (e *Environment) Close() error { return e.Registry.Close() }

// Options shape a demo run.
type Options struct {
	// Listen is where the image server listens (default 127.0.0.1:0); the
	// caller checks it.
	Listen string
	// Once stops after the self-check instead of serving until ctx ends.
	Once bool
}

// Run starts the demo environment, resolves the catalog, serves the images
// the management cluster selects on 127.0.0.1 (pulled, verified and stored
// for real), checks one download over HTTP, and renders a sample workload
// cluster's Metal3MachineTemplates against what is served. It writes
// os-images-info, the served-images ConfigMap and the templates to out as
// one YAML stream, then serves until ctx ends unless opts.Once. Progress goes
// to log.
func Run(ctx context.Context, out, log io.Writer, opts Options) error {
	env, err := Start(ctx)
	if err != nil {
		return err
	}
	defer env.Close()
	fmt.Fprintf(log, "demo: published %d diskimage-builder artifacts to the in-process registry %s\n", len(Images), env.Registry.Host)

	plan, err := catalog.PlanFromValues(env.Values, nil)
	if err != nil {
		return err
	}
	client, err := oci.NewClient(oci.Options{Insecure: plan.Insecure})
	if err != nil {
		return err
	}
	resolved, err := catalog.Resolve(ctx, plan, client, catalog.ResolveOptions{Signatures: signature.Verifier{Client: client}})
	if err != nil {
		return err
	}
	infoCM, err := catalog.ConfigMap(catalog.DefaultNamespace, resolved, plan.InputsHash())
	if err != nil {
		return err
	}
	fmt.Fprintf(log, "demo: catalog resolved %d images into ConfigMap os-images-info (cosign signatures verified)\n", len(resolved))

	srv, base, stop, err := serve(ctx, env, infoCM, opts.Listen)
	if err != nil {
		return err
	}
	defer stop()
	served := srv.Served()
	for sum, e := range served {
		fmt.Fprintf(log, "demo: serving %s: curl -O %s%s\n", e.ImageKey, base, osimage.ImagePath(sum, resolved[e.ImageKey].Get(osimage.FieldFilename)))
	}
	if err := checkDownload(ctx, base, resolved, served); err != nil {
		return err
	}

	templates, err := RenderCluster(resolved, served, strings.TrimPrefix(base, "http://"), "http")
	if err != nil {
		return err
	}
	for _, t := range templates {
		fmt.Fprintf(log, "demo: %s -> %s (image %s)\n", t.Level, t.Name(), t.ImageKey)
	}
	if err := writeStream(out, infoCM, served, templates); err != nil {
		return err
	}
	if opts.Once {
		return nil
	}
	fmt.Fprintf(log, "demo: the image server keeps serving on %s (status page at %s/); press Ctrl-C to stop\n", base, base)
	<-ctx.Done()
	return nil
}

// serve runs the image server as `osimages serve` does (internal/serve),
// over a temporary data directory, with the demo's catalog and management
// values as its input files, and waits until every selected image is ready.
func serve(ctx context.Context, env *Environment, infoCM *corev1.ConfigMap, listen string) (*server.Server, string, func(), error) {
	dir, err := os.MkdirTemp("", "osimages-demo-data-")
	if err != nil {
		return nil, "", nil, err
	}
	fail := func(err error) (*server.Server, string, func(), error) {
		os.RemoveAll(dir)
		return nil, "", nil, err
	}
	mgmt, err := values.Parse(mgmtYAML)
	if err != nil {
		return fail(fmt.Errorf("embedded demo management values: %w", err))
	}
	// The management cluster's own values name the registries, their keys
	// and oci_registry_insecure, as Sylva's do: the server takes its
	// signature policy from them. The catalog inputs are the catalog's.
	mgmt = values.Merge(env.Values, mgmt)
	delete(mgmt, "os_images")
	delete(mgmt, "sylva_diskimagebuilder_images")
	osImages, valuesFile := filepath.Join(dir, "os-images-info.yaml"), filepath.Join(dir, "mgmt-values.yaml")
	for file, obj := range map[string]any{osImages: infoCM, valuesFile: mgmt} {
		data, err := yaml.Marshal(obj)
		if err == nil {
			err = os.WriteFile(file, data, 0o600)
		}
		if err != nil {
			return fail(err)
		}
	}
	if listen == "" {
		listen = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return fail(err)
	}
	d, err := imageserver.Open(imageserver.Options{
		Data: filepath.Join(dir, "data"), Listener: ln, OSImages: osImages, ValueFiles: []string{valuesFile},
		Limits: server.Config{
			Concurrency: server.DefaultConcurrency, GCGrace: server.DefaultGCGrace, StallTimeout: server.DefaultStallTimeout,
			FreeSpaceMargin: 1 << 20, MaxImageSize: server.DefaultMaxImageSize, MinRate: server.DefaultMinRate,
			ScrubInterval: server.DefaultScrubInterval, ScrubRate: server.DefaultScrubRate,
		},
		Poll:   2 * time.Second,
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		ln.Close()
		return fail(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- d.Run(runCtx) }()
	stop := func() {
		cancel()
		<-done
		ln.Close()
		os.RemoveAll(dir)
	}
	srv := d.Server()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		statuses, _ := srv.Statuses()
		ready := 0
		for _, st := range statuses {
			if st.Phase == server.PhaseFailed {
				stop()
				return nil, "", nil, fmt.Errorf("demo image %s failed: %s", st.Key, st.Reason)
			}
			if st.Phase == server.PhaseReady {
				ready++
			}
		}
		if ready > 0 && ready == len(statuses) {
			break
		}
		select {
		case err := <-done:
			done <- err
			stop()
			return nil, "", nil, fmt.Errorf("demo image server stopped: %v", err)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			stop()
			return nil, "", nil, fmt.Errorf("demo images not ready in time: %+v", statuses)
		}
	}
	return srv, "http://" + ln.Addr().String(), stop, nil
}

// checkDownload fetches every served image over HTTP and compares its
// sha256 with the catalog's, as a client would.
func checkDownload(ctx context.Context, base string, cat osimage.Catalog, served osimage.ServedSet) error {
	for sum, e := range served {
		url := base + osimage.ImagePath(sum, cat[e.ImageKey].Get(osimage.FieldFilename))
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		h := sha256.New()
		_, err = io.Copy(h, resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK {
			return fmt.Errorf("demo: GET %s: %d %v", url, resp.StatusCode, err)
		}
		if got := hex.EncodeToString(h.Sum(nil)); got != sum.String() {
			return fmt.Errorf("demo: GET %s returned sha256 %s", url, got)
		}
	}
	return nil
}

func writeStream(out io.Writer, infoCM *corev1.ConfigMap, served osimage.ServedSet, templates []capm3.Template) error {
	servedDoc, err := osimage.MarshalServed(served)
	if err != nil {
		return err
	}
	servedCM := &corev1.ConfigMap{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{Name: osimage.ServedConfigMapName, Namespace: osimage.ServedConfigMapNamespace},
		Data:       map[string]string{osimage.ValuesKey: string(servedDoc)},
	}
	var buf bytes.Buffer
	for _, obj := range []any{infoCM, servedCM} {
		data, err := yaml.Marshal(obj)
		if err != nil {
			return err
		}
		buf.WriteString("---\n")
		buf.Write(data)
	}
	docs, err := capm3.MarshalYAML(templates)
	if err != nil {
		return err
	}
	buf.Write(docs)
	_, err = out.Write(buf.Bytes())
	return err
}

// RenderCluster renders the demo's workload cluster with catalog (A) and
// served set (B), its images served from host with scheme.
func RenderCluster(a osimage.Catalog, b osimage.ServedSet, host, scheme string) ([]capm3.Template, error) {
	v, err := values.Parse(clusterYAML)
	if err != nil {
		return nil, fmt.Errorf("embedded demo cluster values: %w", err)
	}
	v = values.Merge(v, values.Values{"capm3": map[string]any{"image_provisioning_host": host, "image_provisioning_scheme": scheme}})
	return capm3.Render(capm3.Input{Values: v, Catalog: a, Served: b, Namespace: "demo-cluster"})
}
