// Command m3manifests renders a Cluster API provider's kustomize package
// (config/default of its tagged module, as its release manifests are made)
// and prints what a manager run as a plain process needs of it: the
// CustomResourceDefinitions and the admission webhook configurations, with
// every webhook reached at a URL instead of an in-cluster Service, and the
// run's CA as the caBundle cert-manager would otherwise inject.
//
//	m3manifests -kustomize DIR -url https://127.0.0.1:9443 -ca ca.crt
//
// Used by hack/metal3/capi.sh (Metal3 in a box, the Cluster API chain). A
// module of its own: kustomize stays out of osimages' go.mod.
package main

import (
	"encoding/base64"
	"flag"
	"fmt"
	"os"
	"strings"

	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// kept are the kinds a process-run manager needs from its package; the
// Deployment, Service, RBAC and cert-manager objects describe running it
// in a cluster, which this does not.
var kept = map[string]bool{
	"CustomResourceDefinition":       true,
	"ValidatingWebhookConfiguration": true,
	"MutatingWebhookConfiguration":   true,
}

func main() {
	dir := flag.String("kustomize", "", "the kustomize package to render (a provider's config/default)")
	url := flag.String("url", "", "base URL of the manager's webhook server, https://HOST:PORT")
	caFile := flag.String("ca", "", "PEM file of the CA that signed the webhook server's certificate")
	flag.Parse()
	if err := run(*dir, *url, *caFile); err != nil {
		fmt.Fprintln(os.Stderr, "m3manifests:", err)
		os.Exit(1)
	}
}

func run(dir, url, caFile string) error {
	if dir == "" || !strings.HasPrefix(url, "https://") || caFile == "" {
		return fmt.Errorf("-kustomize DIR, -url https://HOST:PORT and -ca FILE are required (got %q, %q, %q)", dir, url, caFile)
	}
	ca, err := os.ReadFile(caFile)
	if err != nil {
		return err
	}
	caBundle := base64.StdEncoding.EncodeToString(ca)
	resources, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		return fmt.Errorf("rendering %s: %w", dir, err)
	}
	n := 0
	for _, r := range resources.Resources() {
		if !kept[r.GetKind()] {
			continue
		}
		obj, err := r.Map()
		if err != nil {
			return err
		}
		// cert-manager's CA injector is not there: the caBundle is set here.
		if md, ok := obj["metadata"].(map[string]any); ok {
			if ann, ok := md["annotations"].(map[string]any); ok {
				delete(ann, "cert-manager.io/inject-ca-from")
				if len(ann) == 0 {
					delete(md, "annotations")
				}
			}
		}
		switch r.GetKind() {
		case "CustomResourceDefinition":
			if conv, ok := dig(obj, "spec", "conversion", "webhook"); ok {
				if err := toURL(conv, url, caBundle, r.GetName()); err != nil {
					return err
				}
			}
		default:
			hooks, _ := obj["webhooks"].([]any)
			for _, h := range hooks {
				if hm, ok := h.(map[string]any); ok {
					if err := toURL(hm, url, caBundle, r.GetName()); err != nil {
						return err
					}
				}
			}
		}
		out, err := yaml.Marshal(obj)
		if err != nil {
			return err
		}
		fmt.Printf("---\n%s", out)
		n++
	}
	if n == 0 {
		return fmt.Errorf("%s renders no CustomResourceDefinition nor webhook configuration", dir)
	}
	return nil
}

// toURL replaces a clientConfig's in-cluster Service by the manager's URL
// with the same path.
func toURL(holder map[string]any, url, caBundle, name string) error {
	cc, ok := holder["clientConfig"].(map[string]any)
	if !ok {
		return fmt.Errorf("%s: a webhook without clientConfig", name)
	}
	path := ""
	if svc, ok := cc["service"].(map[string]any); ok {
		path, _ = svc["path"].(string)
	}
	delete(cc, "service")
	cc["url"] = strings.TrimSuffix(url, "/") + path
	cc["caBundle"] = caBundle
	return nil
}

// dig walks nested maps.
func dig(obj map[string]any, path ...string) (map[string]any, bool) {
	for _, p := range path {
		next, ok := obj[p].(map[string]any)
		if !ok {
			return nil, false
		}
		obj = next
	}
	return obj, true
}
