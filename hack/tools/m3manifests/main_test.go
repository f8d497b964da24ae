package main

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

// A package shaped as the providers' config/default: a webhook Service's
// Certificate from an Issuer, a webhook configuration and a CRD with a
// conversion webhook asking for the CA, a CRD without one asking too, a
// Deployment with clusterctl variables, its Namespace listed last.
const pkg = `
resources: [deploy.yaml, certs.yaml, hooks.yaml, ns.yaml]
`

const deploy = `apiVersion: apps/v1
kind: Deployment
metadata: {name: manager, namespace: sys}
spec:
  selector: {matchLabels: {app: m}}
  template:
    metadata: {labels: {app: m}}
    spec:
      containers:
      - name: manager
        image: example.org/manager:main
        args: ["--diagnostics-address=${DIAG_ADDR:=:8443}", "--feature-gates=Pool=${EXP_POOL:=true}"]
`

const certs = `apiVersion: cert-manager.io/v1
kind: Issuer
metadata: {name: selfsigned, namespace: sys}
spec: {selfSigned: {}}
---
apiVersion: cert-manager.io/v1
kind: Certificate
metadata: {name: serving-cert, namespace: sys}
spec:
  secretName: webhook-cert
  dnsNames: [webhook-service.sys.svc, webhook-service.sys.svc.cluster.local]
  issuerRef: {kind: Issuer, name: selfsigned}
`

const hooks = `apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata:
  name: validating
  annotations: {cert-manager.io/inject-ca-from: sys/serving-cert}
webhooks:
- name: v.example.org
  admissionReviewVersions: [v1]
  sideEffects: None
  clientConfig: {service: {name: webhook-service, namespace: sys, path: /validate}}
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: things.example.org
  annotations: {cert-manager.io/inject-ca-from: sys/serving-cert, keep: "yes"}
spec:
  group: example.org
  names: {kind: Thing, plural: things}
  scope: Namespaced
  versions: [{name: v1, served: true, storage: true, schema: {openAPIV3Schema: {type: object}}}]
  conversion:
    strategy: Webhook
    webhook:
      conversionReviewVersions: [v1]
      clientConfig: {service: {name: webhook-service, namespace: sys, path: /convert}}
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: plain.example.org
  annotations: {cert-manager.io/inject-ca-from: sys/serving-cert}
spec:
  group: example.org
  names: {kind: Plain, plural: plain}
  scope: Namespaced
  versions: [{name: v1, served: true, storage: true, schema: {openAPIV3Schema: {type: object}}}]
`

const ns = `apiVersion: v1
kind: Namespace
metadata: {name: sys}
`

func writePackage(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func testCA(t *testing.T) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key")
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	if err := os.WriteFile(certFile, caPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	pool = x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	return certFile, keyFile, pool
}

func render(t *testing.T, dir, ca, key string, given vars) []map[string]any {
	t.Helper()
	var out bytes.Buffer
	if err := run(&out, dir, ca, key, given); err != nil {
		t.Fatal(err)
	}
	objs, err := splitObjects(out.String())
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

func find(t *testing.T, objs []map[string]any, kind, name string) map[string]any {
	t.Helper()
	for _, o := range objs {
		md, _ := o["metadata"].(map[string]any)
		if o["kind"] == kind && md["name"] == name {
			return o
		}
	}
	t.Fatalf("no %s %s among the objects rendered", kind, name)
	return nil
}

func decoded(t *testing.T, v any) []byte {
	t.Helper()
	s, ok := v.(string)
	if !ok {
		t.Fatalf("%v is not a base64 string", v)
	}
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestRenderStandsInForCertManagerAndClusterctl(t *testing.T) {
	dir := writePackage(t, map[string]string{"kustomization.yaml": pkg, "deploy.yaml": deploy, "certs.yaml": certs, "hooks.yaml": hooks, "ns.yaml": ns})
	caFile, keyFile, pool := testCA(t)
	caPEM, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	objs := render(t, dir, caFile, keyFile, vars{"EXP_POOL": "false"})

	if objs[0]["kind"] != "Namespace" {
		t.Errorf("the first object is a %v, want the Namespace", objs[0]["kind"])
	}
	for _, o := range objs {
		if g, _, _ := strings.Cut(str(o, "apiVersion"), "/"); g == "cert-manager.io" {
			t.Errorf("a cert-manager %v is left: nothing here would act on it", o["kind"])
		}
	}

	// The Secret the Certificate names, for its DNS names, from the CA.
	secret := find(t, objs, "Secret", "webhook-cert")
	if secret["type"] != "kubernetes.io/tls" || str(secret["metadata"].(map[string]any), "namespace") != "sys" {
		t.Errorf("secret: type %v metadata %v", secret["type"], secret["metadata"])
	}
	data := secret["data"].(map[string]any)
	block, _ := pem.Decode(decoded(t, data["tls.crt"]))
	if block == nil {
		t.Fatal("tls.crt holds no PEM certificate")
	}
	crt, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"webhook-service.sys.svc", "webhook-service.sys.svc.cluster.local"} {
		if _, err := crt.Verify(x509.VerifyOptions{DNSName: name, Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
			t.Errorf("the issued certificate does not serve %s: %v", name, err)
		}
	}
	if kb, _ := pem.Decode(decoded(t, data["tls.key"])); kb == nil {
		t.Error("tls.key holds no PEM key")
	}
	if !bytes.Equal(decoded(t, data["ca.crt"]), caPEM) {
		t.Error("ca.crt is not the CA")
	}

	// The CA injected where asked, the annotation gone, others kept.
	hook := find(t, objs, "ValidatingWebhookConfiguration", "validating")
	cc := hook["webhooks"].([]any)[0].(map[string]any)["clientConfig"].(map[string]any)
	if !bytes.Equal(decoded(t, cc["caBundle"]), caPEM) {
		t.Error("the webhook's caBundle is not the CA")
	}
	if _, ok := cc["service"]; !ok {
		t.Error("the webhook no longer names its Service")
	}
	if md := hook["metadata"].(map[string]any); md["annotations"] != nil {
		t.Errorf("webhook annotations left: %v", md["annotations"])
	}
	crd := find(t, objs, "CustomResourceDefinition", "things.example.org")
	conv, _ := dig(crd, "spec", "conversion", "webhook", "clientConfig")
	if !bytes.Equal(decoded(t, conv["caBundle"]), caPEM) {
		t.Error("the conversion webhook's caBundle is not the CA")
	}
	if ann := crd["metadata"].(map[string]any)["annotations"].(map[string]any); ann["keep"] != "yes" || ann[injectCAFrom] != nil {
		t.Errorf("CRD annotations %v: want keep only", ann)
	}
	plain := find(t, objs, "CustomResourceDefinition", "plain.example.org")
	if plain["metadata"].(map[string]any)["annotations"] != nil {
		t.Error("the CRD without a conversion webhook keeps the injection annotation")
	}

	// clusterctl's variables: the default, or the value given.
	d := find(t, objs, "Deployment", "manager")
	args, _ := yaml.Marshal(d["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)["containers"])
	for _, want := range []string{"--diagnostics-address=:8443", "--feature-gates=Pool=false"} {
		if !strings.Contains(string(args), want) {
			t.Errorf("containers %s: no %s", args, want)
		}
	}
}

func TestRenderRefusesWhatItCannotStandInFor(t *testing.T) {
	caFile, keyFile, _ := testCA(t)
	for _, c := range []struct {
		name  string
		files map[string]string
		says  []string
	}{
		{"a variable without a default", map[string]string{
			"kustomization.yaml": "resources: [d.yaml]\n",
			"d.yaml":             strings.Replace(deploy, "${EXP_POOL:=true}", "${EXP_POOL}", 1),
		}, []string{"EXP_POOL", "no default", "-var"}},
		{"a Certificate without names", map[string]string{
			"kustomization.yaml": "resources: [c.yaml]\n",
			"c.yaml":             strings.Replace(certs, "dnsNames: [webhook-service.sys.svc, webhook-service.sys.svc.cluster.local]", "dnsNames: []", 1),
		}, []string{"Certificate sys/serving-cert", "dnsNames"}},
		{"a webhook configuration without a client", map[string]string{
			"kustomization.yaml": "resources: [h.yaml]\n",
			"h.yaml": `apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata: {name: m, annotations: {cert-manager.io/inject-ca-from: sys/serving-cert}}
webhooks: []
`,
		}, []string{"MutatingWebhookConfiguration m", "no webhook clientConfig"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := run(&bytes.Buffer{}, writePackage(t, c.files), caFile, keyFile, vars{})
			if err == nil {
				t.Fatal("rendered")
			}
			for _, s := range c.says {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not say %q", err, s)
				}
			}
		})
	}
}
