package chart

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/sylva-projects/osimages/internal/values"
)

const testCA = `-----BEGIN CERTIFICATE-----
MIIBdzCCAR2gAwIBAgIUEXAMPLEEXAMPLEEXAMPLEEXAMPLEwCgYIKoZIzj0EAwIw
-----END CERTIFICATE-----`

// variants are the value sets the chart is proven with: the defaults and
// what Sylva operators set, each rendered by Helm's library and applied to
// a real apiserver.
var variants = []struct {
	name       string
	namespaces []string
	values     string
	check      func(t *testing.T, r *Rendered)
}{
	{
		name: "defaults",
		check: func(t *testing.T, r *Rendered) {
			sts := r.Find("StatefulSet", "osimages-server")
			if sts == nil {
				t.Fatal("no StatefulSet osimages-server")
			}
			c := container(t, sts)
			if p, _, _ := unstructured.NestedString(c, "readinessProbe", "httpGet", "path"); p != "/readyz" {
				t.Errorf("server readiness probe on %q, want /readyz", p)
			}
			if ro, _, _ := unstructured.NestedBool(c, "securityContext", "readOnlyRootFilesystem"); !ro {
				t.Error("server root filesystem is writable by default")
			}
			if nr, _, _ := unstructured.NestedBool(sts.Object, "spec", "template", "spec", "securityContext", "runAsNonRoot"); !nr {
				t.Error("server pod may run as root by default")
			}
			if !strings.Contains(toYAML(t, sts), "storage: 30Gi") {
				t.Error("the data volume claim does not ask for the default 30Gi")
			}
			for _, kind := range []string{"NetworkPolicy", "Service"} {
				if r.Find(kind, "osimages-server") == nil {
					t.Errorf("no %s osimages-server", kind)
				}
			}
			d := r.Find("Deployment", "osimages-controller")
			if d == nil {
				t.Fatal("no controller Deployment by default")
			}
			if n, _, _ := unstructured.NestedFieldNoCopy(d.Object, "spec", "replicas"); fmt.Sprint(n) != "2" {
				t.Errorf("controller replicas %v, want 2", n)
			}
			args := strings.Join(stringsOf(container(t, d)["args"]), " ")
			if !contains(args, "controller", "--leader-elect", "--leader-election-id=osimages-controller", "--catalog=true", "--propagate=true", "--check=true") {
				t.Errorf("controller args %s", args)
			}
			if r.Find("PodDisruptionBudget", "osimages-controller") == nil {
				t.Error("no PodDisruptionBudget for the controller")
			}
			if r.Find("Deployment", "osimages-propagate") != nil {
				t.Error("propagation runs twice")
			}
			svcName, _, _ := unstructured.NestedString(sts.Object, "spec", "serviceName")
			headless := r.Find("Service", svcName)
			if ip, _, _ := unstructured.NestedString(headless.Object, "spec", "clusterIP"); headless == nil || ip != "None" {
				t.Errorf("the StatefulSet's serviceName %q is not a headless Service", svcName)
			}
			if r.Find("Ingress", "osimages-server") != nil {
				t.Error("an Ingress by default")
			}
			// One replica is a set of one: the same pod and RBAC as three
			// (TestServerPodSameForEveryReplicaCount), no budget.
			if args := strings.Join(stringsOf(c["args"]), " "); !strings.Contains(args, "--peers-service") || !strings.Contains(args, "--replica-id") {
				t.Errorf("one replica runs without the peer flags: %s", args)
			}
			if r.Find("Role", "osimages-server-peers") == nil {
				t.Error("one server replica has no peers' Role")
			}
			if r.Find("PodDisruptionBudget", "osimages-server") != nil {
				t.Error("one server replica gets a PodDisruptionBudget")
			}
			// Deletes only of the propagated copies, by name, and the
			// ownership check of the delete guard beside it.
			cr := r.Find("ClusterRole", "osimages-controller-sylva-system")
			rules, _, _ := unstructured.NestedSlice(cr.Object, "rules")
			var deletable []string
			for _, rule := range rules {
				rm := rule.(map[string]any)
				if slices.Contains(stringsOf(rm["verbs"]), "delete") {
					if rm["resourceNames"] == nil {
						t.Errorf("the controller may delete any ConfigMap: %v", rm)
						continue
					}
					deletable = append(deletable, stringsOf(rm["resourceNames"])...)
				}
			}
			if !slices.Equal(deletable, []string{"kyverno-cloned-os-image-server-images"}) {
				t.Errorf("the controller may delete %v, want its copies only", deletable)
			}
			if r.Find("ValidatingAdmissionPolicy", "osimages-sylva-system-delete-guard") == nil || r.Find("ValidatingAdmissionPolicyBinding", "osimages-sylva-system-delete-guard") == nil {
				t.Error("no delete guard")
			}
		},
	},
	{
		name: "sylva-operator",
		values: `
os_image_selectors:
- {os: ubuntu, k8s-flavor: rke2, k8s-version: '1\.32\.5\+rke2r1', hardened: false}
os_image_server_additional_selectors:
  opensuse-hardened: {os: opensuse, hardened: "true"}
osImagePersistenceDefaults: {size: 200Gi, storageClass: local-path}
proxies: {http_proxy: "http://proxy.example.org:3128", https_proxy: "http://proxy.example.org:3128", no_proxy: "10.0.0.0/8,.cluster.local"}
oci_registry_extra_ca_certs: |
` + indent(testCA, "  ") + `
oci_registry_insecure: true
registryCredentialsSecret: registry-credentials
ingress:
  enabled: true
  className: nginx
  host: os-images.sylva.example.org
  tls: {enabled: true, secretName: os-image-server-tls}
service: {type: LoadBalancer, port: 443, nodePort: 30443}
server:
  tlsSecret: os-image-server-tls
  maxStorage: 150Gi
  stallTimeout: 2m
  minRate: "0"
  maxImageSize: 32Gi
  scrub: {interval: 0s, rate: 20Mi}
  resources: {requests: {cpu: 500m, memory: 256Mi}, limits: {memory: 1Gi}}
networkPolicy:
  ingressFrom:
  - namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: metal3-system}}
  - ipBlock: {cidr: 192.0.2.0/24}
  egressPorts: [443, 6443, 3128, 5000]
fleetNeeds:
  enabled: true
  allowPrefixes: [https://images.example.org/dib/]
  perNamespace: {maxImages: 5, maxBytes: 50Gi}
`,
		check: func(t *testing.T, r *Rendered) {
			fleetArgs := strings.Join(stringsOf(container(t, r.Find("StatefulSet", "osimages-server"))["args"]), " ")
			if !contains(fleetArgs, "--serve-fleet-needs", "--fleet-needs-configmap=", "/osimages-fleet-needs",
				"--fleet-needs-max-images-per-namespace=5", "--fleet-needs-max-bytes-per-namespace=50Gi", "--fleet-needs-allow-prefix=https://images.example.org/dib/") {
				t.Errorf("server args without the fleet's needs: %s", fleetArgs)
			}
			role := r.Find("Role", "osimages-server-fleet-needs-reader")
			if role == nil || !strings.Contains(toYAML(t, role), "- osimages-fleet-needs") || strings.Contains(toYAML(t, role), "create") {
				t.Errorf("the server may not read the fleet's needs, or more: %v", role)
			}
			cm := r.Find("ConfigMap", "osimages-server-values")
			doc, _, _ := unstructured.NestedString(cm.Object, "data", "values.yaml")
			if !contains(doc, "os_image_selectors-0:", "opensuse-hardened:", "oci_registry_insecure: true") {
				t.Errorf("server values do not carry the selectors:\n%s", doc)
			}
			args := strings.Join(stringsOf(container(t, r.Find("StatefulSet", "osimages-server"))["args"]), " ")
			if !contains(args, "--ca-file=", "--registry-config=", "--tls-cert=", "--max-storage=150Gi",
				"--stall-timeout=2m", "--min-rate=0", "--max-image-size=32Gi", "--scrub-interval=0s", "--scrub-rate=20Mi") {
				t.Errorf("server args %s", args)
			}
			ing := r.Find("Ingress", "osimages-server")
			if ing == nil {
				t.Fatal("no Ingress")
			}
			// The server speaks TLS: so must the ingress controller to it.
			if ing.GetAnnotations()["nginx.ingress.kubernetes.io/backend-protocol"] != "HTTPS" {
				t.Errorf("Ingress annotations %v: no backend-protocol HTTPS with server.tlsSecret", ing.GetAnnotations())
			}
			// Images only, by their URLs and by the OCI distribution API:
			// the status page and metrics stay on the Service.
			y := toYAML(t, ing)
			if strings.Count(y, "path:") != 2 || !strings.Contains(y, "path: /images/") || !strings.Contains(y, "path: /v2/") {
				t.Errorf("the Ingress routes other paths than /images/ and /v2/:\n%s", y)
			}
			if !strings.Contains(toYAML(t, r.Find("Service", "osimages-server")), "appProtocol: https") {
				t.Error("the Service port has no appProtocol https")
			}
			// serve finds its peers' client port by the name http, TLS or not.
			if h := toYAML(t, r.Find("Service", "osimages-server-headless")); !contains(h, "name: http\n", "appProtocol: https") {
				t.Errorf("the headless Service's client port is not named http with appProtocol https:\n%s", h)
			}
		},
	},
	{
		name:       "propagation-alone-and-catalog",
		namespaces: []string{"catalogs"},
		values: `
propagation: {enabled: true, adopt: true}
# Adopting is what the delete guard refuses (the guard's own test is
# TestDeleteGuard).
deleteGuard: {enabled: false}
controller: {enabled: false}
catalogJob:
  enabled: true
  namespace: catalogs
  values:
    sylva_base_oci_registry: oci://registry.example.org/sylva-projects
    sylva_diskimagebuilder_version: 0.7.6
    os_images_oci_registries:
      sylva: {url: '{{ .Values.sylva_base_oci_registry }}/sylva-elements/diskimage-builder', tag: '{{ .Values.sylva_diskimagebuilder_version }}'}
    sylva_diskimagebuilder_images:
      ubuntu-noble-plain-rke2-1-32: {os_images_oci_registry: sylva}
`,
		check: func(t *testing.T, r *Rendered) {
			d := r.Find("Deployment", "osimages-propagate")
			if d == nil {
				t.Fatal("no propagation Deployment")
			}
			args := strings.Join(stringsOf(container(t, d)["args"]), " ")
			if !contains(args, "propagate", "--leader-elect", "--adopt", "--config=") {
				t.Errorf("propagation args %s", args)
			}
			if r.Find("PodDisruptionBudget", "osimages-propagate") == nil {
				t.Error("no PodDisruptionBudget for the propagation replicas")
			}
			if r.Find("Deployment", "osimages-controller") != nil {
				t.Error("the controller runs beside propagation")
			}
			jobs := 0
			for _, o := range r.Objects {
				if o.GetKind() == "Job" && strings.HasPrefix(o.GetName(), "osimages-catalog-") {
					jobs++
				}
			}
			if jobs != 1 {
				t.Errorf("%d catalog Jobs, want 1", jobs)
			}
		},
	},
	{
		name:       "own-namespaces-server-creates-output",
		namespaces: []string{"images-in", "images-out"},
		values: `
fullnameOverride: osi
osImagesInfoConfigMap: {namespace: images-in}
outputConfigMap: {namespace: images-out, create: false}
networkPolicy: {enabled: false}
service: {type: NodePort, nodePort: 30080}
controller: {enabled: false}
propagation:
  enabled: true
  replicas: 1
  extraRules:
  - name: mgmt-cluster-state
    source: sylva-system/mgmt-cluster-state-values
    target: mgmt-cluster-state-values
    namespaceSelector: {}
image: {digest: "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"}
`,
		check: func(t *testing.T, r *Rendered) {
			role := r.Find("Role", "osi-server-output-writer")
			if role == nil || role.GetNamespace() != "images-out" {
				t.Fatalf("output Role %v, want it in images-out", role)
			}
			if r.Find("PodDisruptionBudget", "osi-propagate") != nil {
				t.Error("a PodDisruptionBudget for one replica blocks node drains")
			}
			cr := r.Find("ClusterRole", "osi-propagate-sylva-system")
			if !strings.Contains(toYAML(t, cr), "mgmt-cluster-state-values") {
				t.Error("the extra rule's target is not writable")
			}
		},
	},
	{
		name: "server-replicas",
		values: `
server:
  replicas: 3
  topologySpreadConstraints:
  - {maxSkew: 1, topologyKey: topology.kubernetes.io/zone, whenUnsatisfiable: ScheduleAnyway, labelSelector: {matchLabels: {app.kubernetes.io/component: server}}}
networkPolicy:
  ingressFrom:
  - namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: metal3-system}}
`,
		check: checkServerReplicas,
	},
	{
		name: "monitoring",
		values: `
monitoring:
  serviceMonitor: {enabled: true, labels: {release: kube-prometheus-stack}}
  prometheusRule: {enabled: true, labels: {release: kube-prometheus-stack}}
  grafanaDashboard: {enabled: true}
server: {tlsSecret: os-image-server-tls}
`,
		check: func(t *testing.T, r *Rendered) {
			for _, kind := range []string{"ServiceMonitor", "PrometheusRule"} {
				n := 0
				for _, o := range r.Objects {
					if o.GetKind() == kind {
						n++
					}
				}
				if want := map[string]int{"ServiceMonitor": 2, "PrometheusRule": 1}[kind]; n != want {
					t.Errorf("%d %s, want %d", n, kind, want)
				}
			}
			if r.Find("ConfigMap", "osimages-dashboard") == nil || r.Find("Service", "osimages-controller-metrics") == nil {
				t.Error("no dashboard ConfigMap or controller metrics Service")
			}
		},
	},
}

// TestChartAppliesToAPIServer renders each variant through Helm's library and
// applies every object with a server-side dry run, so that the apiserver's
// own validation (schemas, CRDs, RBAC rules) judges what Helm would install.
func TestChartAppliesToAPIServer(t *testing.T) {
	k := apiserver(t)
	a := newApplier(t, k.Config)
	ctx := context.Background()
	ensureNamespace(t, k, "sylva-system", nil)
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			vals, err := LoadValues([]byte(v.values))
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			r, err := Render(chartDir, Release{Name: "osimages", Namespace: "sylva-system"}, vals)
			if err != nil {
				t.Fatal(err)
			}
			rendered := time.Since(start)
			if v.check != nil {
				v.check(t, r)
			}
			for _, ns := range v.namespaces {
				ensureNamespace(t, k, ns, nil)
			}
			start = time.Now()
			if err := a.apply(ctx, r.Objects, true); err != nil {
				t.Fatalf("the apiserver refuses what the chart renders:\n%v", err)
			}
			t.Logf("%d objects: rendered in %s, dry-run applied in %s", len(r.Objects), rendered.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
		})
	}

	// The dry run is a real judge: an object the apiserver must refuse is
	// refused.
	r, err := Render(chartDir, Release{Name: "osimages", Namespace: "sylva-system"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	bad := r.Find("StatefulSet", "osimages-server").DeepCopy()
	_ = unstructured.SetNestedField(bad.Object, "-1", "spec", "replicas")
	if err := a.apply(ctx, []*unstructured.Unstructured{bad}, true); err == nil {
		t.Error("a StatefulSet with replicas \"-1\" passed the dry run")
	}
}

// TestSchemaRefusesWrongValues: a wrong value fails at render time, as at
// `helm install`, with a message that names the value.
func TestSchemaRefusesWrongValues(t *testing.T) {
	cases := []struct {
		name, values string
		want         []string
	}{
		{"service type", `service: {type: Ingress}`, []string{"/service/type", "ClusterIP"}},
		{"persistence size", `osImagePersistenceDefaults: {size: lots}`, []string{"/osImagePersistenceDefaults/size", "'lots' does not match"}},
		{"misspelt Sylva key", `os_image_selector: [{os: ubuntu}]`, []string{"os_image_selector"}},
		{"selector value", `os_image_selectors: [{os: [ubuntu]}]`, []string{"/os_image_selectors/0/os"}},
		{"duration", `server: {gcGrace: "one hour"}`, []string{"/server/gcGrace", "'one hour' does not match"}},
		{"replicas", `controller: {replicas: 0}`, []string{"/controller/replicas"}},
		{"propagation twice", `propagation: {enabled: true}`, []string{"controller.propagate and propagation.enabled are both true"}},
		{"ingress without host", `ingress: {enabled: true}`, []string{"ingress.host is empty"}},
		{"adopting under the delete guard", `propagation: {adopt: true}`, []string{"propagation.adopt is true, but the delete guard", "kubectl label configmap"}},
		{"CA not PEM", `oci_registry_extra_ca_certs: "not a certificate"`, []string{"/oci_registry_extra_ca_certs"}},
		{"PDB as many as replicas", `controller: {replicas: 2, pdb: {minAvailable: 2}}`, []string{"controller.pdb.minAvailable is 2", "block every node drain"}},
		{"PDB above replicas", `controller: {replicas: 3, pdb: {minAvailable: 5}}`, []string{"controller.pdb.minAvailable is 5"}},
		{"PDB of 100%", `controller: {pdb: {minAvailable: "100%"}}`, []string{"controller.pdb.minAvailable is 100%"}},
		{"PDB percentage rounded up to all", `controller: {replicas: 2, pdb: {minAvailable: "51%"}}`, []string{"controller.pdb.minAvailable is 51%"}},
		{"PDB not a number", `controller: {pdb: {minAvailable: "half"}}`, []string{"/controller/pdb/minAvailable"}},
		{"server replicas", `server: {replicas: 0}`, []string{"/server/replicas"}},
		{"server PDB blocks drains", `server: {replicas: 3, pdb: {maxUnavailable: 0}}`, []string{"server.pdb.maxUnavailable is 0", "block every node drain"}},
		{"server PDB of 0%", `server: {replicas: 3, pdb: {maxUnavailable: "0%"}}`, []string{"server.pdb.maxUnavailable is 0%", "block every node drain"}},
		{"server PDB of 0 before scaling out", `server: {pdb: {maxUnavailable: 0}}`, []string{"server.pdb.maxUnavailable is 0"}},
		{"server PDB above 100%", `server: {replicas: 3, pdb: {maxUnavailable: "150%"}}`, []string{"/server/pdb/maxUnavailable"}},
		{"server PDB negative", `server: {replicas: 3, pdb: {maxUnavailable: -1}}`, []string{"/server/pdb/maxUnavailable"}},
		{"server PDB not a number", `server: {replicas: 3, pdb: {maxUnavailable: "one"}}`, []string{"/server/pdb/maxUnavailable"}},
		{"server PDB minAvailable", `server: {replicas: 3, pdb: {minAvailable: 2}}`, []string{"minAvailable"}},
		{"stall timeout not a duration", `server: {stallTimeout: "a minute"}`, []string{"/server/stallTimeout"}},
		{"scrub rate not a quantity", `server: {scrub: {rate: "fast"}}`, []string{"/server/scrub/rate", "'fast' does not match"}},
		{"scrub misspelt", `server: {scrub: {intervall: 24h}}`, []string{"intervall"}},
		{"alert delay not a duration", `monitoring: {prometheusRule: {for: {downloadFailing: "half an hour"}}}`, []string{"/monitoring/prometheusRule/for/downloadFailing"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			vals, err := LoadValues([]byte(c.values))
			if err != nil {
				t.Fatal(err)
			}
			_, err = Render(chartDir, Release{Name: "osimages", Namespace: "sylva-system"}, vals)
			if err == nil {
				t.Fatalf("values %s rendered", c.values)
			}
			if !contains(err.Error(), c.want...) {
				t.Errorf("error does not say %q:\n%v", c.want, err)
			}
		})
	}
}

func container(t *testing.T, o *unstructured.Unstructured) map[string]any {
	t.Helper()
	if o == nil {
		t.Fatal("no such object")
	}
	cs, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
	if len(cs) != 1 {
		t.Fatalf("%s %s: %d containers, want 1", o.GetKind(), o.GetName(), len(cs))
	}
	return cs[0].(map[string]any)
}

func stringsOf(v any) []string {
	var out []string
	for _, s := range v.([]any) {
		out = append(out, s.(string))
	}
	return out
}

func toYAML(t *testing.T, o *unstructured.Unstructured) string {
	t.Helper()
	if o == nil {
		t.Fatal("no such object")
	}
	b, err := yaml.Marshal(o.Object)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func indent(s, prefix string) string {
	return prefix + strings.ReplaceAll(s, "\n", "\n"+prefix)
}

// TestIngressOptions: an annotation given by the operator wins over the
// chart's backend protocol, no backend protocol is set without TLS, and
// ingress.exposeStatus routes the status page and metrics too.
func TestIngressOptions(t *testing.T) {
	render := func(doc string) *unstructured.Unstructured {
		t.Helper()
		vals, err := LoadValues([]byte(doc))
		if err != nil {
			t.Fatal(err)
		}
		r, err := Render(chartDir, Release{Name: "osimages", Namespace: "sylva-system"}, vals)
		if err != nil {
			t.Fatal(err)
		}
		return r.Find("Ingress", "osimages-server")
	}
	plain := render(`ingress: {enabled: true, host: h.example.org}`)
	if _, ok := plain.GetAnnotations()["nginx.ingress.kubernetes.io/backend-protocol"]; ok {
		t.Error("backend-protocol set for a plain HTTP server")
	}
	own := render(`{server: {tlsSecret: s}, ingress: {enabled: true, host: h.example.org, annotations: {nginx.ingress.kubernetes.io/backend-protocol: GRPCS}}}`)
	if got := own.GetAnnotations()["nginx.ingress.kubernetes.io/backend-protocol"]; got != "GRPCS" {
		t.Errorf("the operator's annotation is replaced by %q", got)
	}
	exposed := toYAML(t, render(`ingress: {enabled: true, host: h.example.org, exposeStatus: true}`))
	for _, want := range []string{"path: /images/", "path: /\n", "path: /metrics"} {
		if !strings.Contains(exposed, want) {
			t.Errorf("exposeStatus: no %q in\n%s", want, exposed)
		}
	}
}

// TestCatalogJobNameCoversItsSpec: for values that shape the catalog Job
// in any way, the Job's name changes whenever its spec or what it reads
// changes, and only then; Kubernetes refuses to change a Job's pod
// template in place.
func TestCatalogJobNameCoversItsSpec(t *testing.T) {
	const base = `catalogJob: {enabled: true, values: {os_images: {a: {uri: "https://example.org/a.raw", sha256: x}}}}`
	changes := []string{
		"",
		`proxies: {no_proxy: .svc}`,
		`catalogJob: {resources: {limits: {memory: 1Gi}}}`,
		"oci_registry_extra_ca_certs: |\n" + indent(testCA, "  "),
		"oci_registry_extra_ca_certs: |\n" + indent(strings.Replace(testCA, "EXAMPLE", "ELPMAXE", 1), "  "),
		`registryCredentialsSecret: creds`,
		`imagePullSecrets: [{name: pull}]`,
		`podSecurityContext: {runAsUser: 1000}`,
		`securityContext: {privileged: false}`,
		`image: {tag: "9.9.9"}`,
		`image: {digest: "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"}`,
		`image: {pullPolicy: Always}`,
		`oci_registry_insecure: true`,
		`catalogJob: {namespace: catalogs}`,
		`catalogJob: {backoffLimit: 0}`,
		`catalogJob: {ttlSecondsAfterFinished: 60}`,
		`catalogJob: {values: {os_images: {b: {uri: "https://example.org/b.raw", sha256: y}}}}`,
		// Not shaping the Job: its name must stay.
		`controller: {replicas: 3}`,
		`service: {port: 8080}`,
	}
	seen := map[string]string{}
	for _, c := range changes {
		vals, err := LoadValues([]byte(base))
		if err != nil {
			t.Fatal(err)
		}
		over, err := LoadValues([]byte(c))
		if err != nil {
			t.Fatal(err)
		}
		vals = values.Merge(vals, over)
		r, err := Render(chartDir, Release{Name: "osimages", Namespace: "sylva-system"}, vals)
		if err != nil {
			t.Fatalf("%s: %v", c, err)
		}
		var j *unstructured.Unstructured
		for _, o := range r.Objects {
			if o.GetKind() == "Job" {
				j = o
			}
		}
		spec, _, _ := unstructured.NestedMap(j.Object, "spec")
		cm := r.Find("ConfigMap", "osimages-catalog-values")
		ca := r.Find("ConfigMap", "osimages-registry-ca")
		key := toYAML(t, &unstructured.Unstructured{Object: map[string]any{"spec": spec, "values": cm.Object["data"], "ca": caData(ca)}})
		if prev, ok := seen[j.GetName()]; ok && prev != key {
			t.Errorf("%q: Job name %s kept for another spec or input:\n%s\nvs\n%s", c, j.GetName(), prev, key)
		}
		seen[j.GetName()] = key
	}
	if len(seen) != len(changes)-2 {
		t.Errorf("%d distinct Job names for %d distinct Jobs", len(seen), len(changes)-2)
	}
}

func caData(o *unstructured.Unstructured) any {
	if o == nil {
		return nil
	}
	return o.Object["data"]
}
