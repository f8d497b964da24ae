// Command m3manifests renders a Cluster API provider's kustomize package
// into the objects to apply to a cluster, as `clusterctl init` does with a
// release's components and cert-manager does once they are applied.
//
//	m3manifests -kustomize DIR -ca ca.crt -ca-key ca.key [-var NAME=VALUE...]
//
// The package is built with kustomize (an overlay of the tagged module's
// config/default, as an operator customises it: images, pull policy, BMO's
// Ironic settings). clusterctl's variables (${NAME:=default}) are
// substituted, from -var NAME=VALUE or their defaults; one without either
// is an error. Then cert-manager's part: each Certificate becomes the
// kubernetes.io/tls Secret it would issue (its secretName, its dnsNames,
// signed by the -ca), Issuers are dropped, and each
// cert-manager.io/inject-ca-from annotation becomes the caBundle its CA
// injector would write.
//
// Used by hack/metal3/capi.sh (Metal3 in a box, the Cluster API chain). A
// module of its own: kustomize stays out of osimages' go.mod.
package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/big"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/drone/envsubst/v2"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// vars is a repeatable -var NAME=VALUE flag.
type vars map[string]string

func (v vars) String() string { return fmt.Sprint(map[string]string(v)) }
func (v vars) Set(s string) error {
	name, value, ok := strings.Cut(s, "=")
	if !ok || name == "" {
		return fmt.Errorf("-var %q: want NAME=VALUE", s)
	}
	v[name] = value
	return nil
}

func main() {
	dir := flag.String("kustomize", "", "the kustomize package to render (a provider's config/default, or an overlay of it)")
	caFile := flag.String("ca", "", "PEM file of the CA that signs the webhook servers' certificates")
	keyFile := flag.String("ca-key", "", "PEM file of that CA's private key")
	given := vars{}
	flag.Var(given, "var", "a clusterctl variable, NAME=VALUE (repeatable); others take their default")
	flag.Parse()
	if err := run(os.Stdout, *dir, *caFile, *keyFile, given); err != nil {
		fmt.Fprintln(os.Stderr, "m3manifests:", err)
		os.Exit(1)
	}
}

func run(w io.Writer, dir, caFile, keyFile string, given vars) error {
	if dir == "" || caFile == "" || keyFile == "" {
		return fmt.Errorf("-kustomize DIR, -ca FILE and -ca-key FILE are required (got %q, %q, %q)", dir, caFile, keyFile)
	}
	ca, err := loadCA(caFile, keyFile)
	if err != nil {
		return err
	}
	opts := krusty.MakeDefaultOptions()
	// An overlay names the module's package by its path in the module
	// cache, outside the overlay's folder.
	opts.LoadRestrictions = types.LoadRestrictionsNone
	resources, err := krusty.MakeKustomizer(opts).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		return fmt.Errorf("rendering %s: %w", dir, err)
	}
	rendered, err := resources.AsYaml()
	if err != nil {
		return err
	}
	substituted, err := substitute(string(rendered), given)
	if err != nil {
		return fmt.Errorf("%s: %w", dir, err)
	}
	objs, err := splitObjects(substituted)
	if err != nil {
		return fmt.Errorf("%s: %w", dir, err)
	}
	out, err := standInForCertManager(objs, ca)
	if err != nil {
		return fmt.Errorf("%s: %w", dir, err)
	}
	// Namespaces first: kubectl apply takes the objects in order, and an
	// overlay may add its namespace after what goes in it.
	slices.SortStableFunc(out, func(a, b map[string]any) int {
		return boolRank(b["kind"] == "Namespace") - boolRank(a["kind"] == "Namespace")
	})
	for _, obj := range out {
		data, err := yaml.Marshal(obj)
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "---\n%s", data)
	}
	return nil
}

// substitute replaces clusterctl's variables as clusterctl does (the same
// library): ${NAME} and ${NAME:=default}. A variable neither given nor
// defaulted is refused, naming it, rather than left empty.
func substitute(doc string, given vars) (string, error) {
	var missing []string
	out, err := envsubst.Eval(doc, func(name string) string {
		if v, ok := given[name]; ok {
			return v
		}
		missing = append(missing, name)
		return ""
	})
	if err != nil {
		return "", fmt.Errorf("substituting clusterctl variables: %w", err)
	}
	// envsubst asks for a defaulted variable too, and takes the default
	// when it is empty: only those without one are missing.
	var undefaulted []string
	for _, name := range missing {
		if !strings.Contains(doc, "${"+name+":=") && !slices.Contains(undefaulted, name) {
			undefaulted = append(undefaulted, name)
		}
	}
	if len(undefaulted) > 0 {
		return "", fmt.Errorf("the clusterctl variables %s have no default: give them with -var NAME=VALUE", strings.Join(undefaulted, ", "))
	}
	return out, nil
}

func splitObjects(doc string) ([]map[string]any, error) {
	var objs []map[string]any
	for _, part := range strings.Split(doc, "\n---\n") {
		if strings.TrimSpace(part) == "" {
			continue
		}
		var obj map[string]any
		if err := yaml.Unmarshal([]byte(part), &obj); err != nil {
			return nil, fmt.Errorf("reading the rendered objects: %w", err)
		}
		if obj != nil {
			objs = append(objs, obj)
		}
	}
	if len(objs) == 0 {
		return nil, errors.New("renders no object")
	}
	return objs, nil
}

const injectCAFrom = "cert-manager.io/inject-ca-from"

// standInForCertManager does what cert-manager would: a Secret issued for
// each Certificate, in its place, and the CA injected where asked.
func standInForCertManager(objs []map[string]any, ca *authority) ([]map[string]any, error) {
	var out []map[string]any
	for _, obj := range objs {
		kind, _ := obj["kind"].(string)
		group, _, _ := strings.Cut(str(obj, "apiVersion"), "/")
		if group == "cert-manager.io" {
			if kind != "Certificate" {
				continue // Issuer, ClusterIssuer: nothing issues here
			}
			secret, err := issue(obj, ca)
			if err != nil {
				return nil, err
			}
			out = append(out, secret)
			continue
		}
		if err := injectCA(obj, ca.pem); err != nil {
			return nil, err
		}
		out = append(out, obj)
	}
	return out, nil
}

// injectCA sets the caBundle of every webhook client of an object that
// asks cert-manager's CA injector for it.
func injectCA(obj map[string]any, caPEM []byte) error {
	md, _ := obj["metadata"].(map[string]any)
	ann, _ := md["annotations"].(map[string]any)
	if _, ok := ann[injectCAFrom]; !ok {
		return nil
	}
	delete(ann, injectCAFrom)
	if len(ann) == 0 {
		delete(md, "annotations")
	}
	var clients []map[string]any
	switch obj["kind"] {
	case "CustomResourceDefinition":
		// A CRD without a conversion webhook has nothing to take the CA.
		if cc, ok := dig(obj, "spec", "conversion", "webhook", "clientConfig"); ok {
			cc["caBundle"] = caPEM
		}
		return nil
	case "ValidatingWebhookConfiguration", "MutatingWebhookConfiguration":
		hooks, _ := obj["webhooks"].([]any)
		for _, h := range hooks {
			if cc, ok := dig(h, "clientConfig"); ok {
				clients = append(clients, cc)
			}
		}
	}
	if len(clients) == 0 {
		return fmt.Errorf("%s %s asks for a CA (%s) but has no webhook clientConfig", obj["kind"], str(md, "name"), injectCAFrom)
	}
	for _, cc := range clients {
		// A []byte field: base64 in JSON and YAML.
		cc["caBundle"] = caPEM
	}
	return nil
}

// issue returns the kubernetes.io/tls Secret cert-manager would write for
// the Certificate cert.
func issue(cert map[string]any, ca *authority) (map[string]any, error) {
	md, _ := cert["metadata"].(map[string]any)
	spec, _ := cert["spec"].(map[string]any)
	name, ns, secretName := str(md, "name"), str(md, "namespace"), str(spec, "secretName")
	var dnsNames []string
	raw, _ := spec["dnsNames"].([]any)
	for _, n := range raw {
		if s, ok := n.(string); ok && s != "" {
			dnsNames = append(dnsNames, s)
		}
	}
	if secretName == "" || len(dnsNames) == 0 {
		return nil, fmt.Errorf("Certificate %s/%s: no spec.secretName or spec.dnsNames to issue", ns, name)
	}
	crt, key, err := ca.sign(dnsNames)
	if err != nil {
		return nil, fmt.Errorf("Certificate %s/%s: %w", ns, name, err)
	}
	smd := map[string]any{"name": secretName, "annotations": map[string]any{"cert-manager.io/certificate-name": name}}
	if ns != "" {
		smd["namespace"] = ns
	}
	return map[string]any{
		"apiVersion": "v1", "kind": "Secret", "metadata": smd, "type": "kubernetes.io/tls",
		"data": map[string]any{"tls.crt": crt, "tls.key": key, "ca.crt": ca.pem},
	}, nil
}

type authority struct {
	cert *x509.Certificate
	key  any
	pem  []byte
}

func loadCA(certFile, keyFile string) (*authority, error) {
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return nil, err
	}
	block, _ := pem.Decode(certPEM)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, fmt.Errorf("%s: no PEM certificate", certFile)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", certFile, err)
	}
	keyPEM, err := os.ReadFile(keyFile)
	if err != nil {
		return nil, err
	}
	kb, _ := pem.Decode(keyPEM)
	if kb == nil {
		return nil, fmt.Errorf("%s: no PEM key", keyFile)
	}
	key, err := x509.ParsePKCS8PrivateKey(kb.Bytes)
	if err != nil {
		if key, err = x509.ParseECPrivateKey(kb.Bytes); err != nil {
			return nil, fmt.Errorf("%s: neither a PKCS#8 nor an EC private key: %w", keyFile, err)
		}
	}
	return &authority{cert: cert, key: key, pem: certPEM}, nil
}

// sign issues a serving certificate for dnsNames, valid two days (a run's
// length), as PEM certificate and key.
func (a *authority) sign(dnsNames []string) (crtPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: dnsNames[0]},
		DNSNames:     dnsNames,
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(48 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.cert, &key.PublicKey, a.key)
	if err != nil {
		return nil, nil, err
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), nil
}

func boolRank(b bool) int {
	if b {
		return 1
	}
	return 0
}

func str(m map[string]any, k string) string { s, _ := m[k].(string); return s }

// dig walks nested maps from v.
func dig(v any, path ...string) (map[string]any, bool) {
	obj, ok := v.(map[string]any)
	for _, p := range path {
		if !ok {
			return nil, false
		}
		obj, ok = obj[p].(map[string]any)
	}
	return obj, ok
}
