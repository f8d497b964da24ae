package main

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"

	"github.com/sylva-projects/osimages/internal/testenv"
)

// sylvaPolicy is the Kyverno ClusterPolicy osimages replaces: the served
// images cloned into every workload-cluster namespace, kept in sync, for
// namespaces that exist before the policy too.
const sylvaPolicy = `apiVersion: kyverno.io/v1
kind: ClusterPolicy
metadata:
  name: capm3-os-image-server-images
spec:
  rules:
  - name: clone-os-image-server-images
    match:
      any:
      - resources:
          kinds: [Namespace]
          selector:
            matchLabels:
              sylva-project.org/workload-cluster: ""
    generate:
      generateExisting: true
      synchronize: true
      apiVersion: v1
      kind: ConfigMap
      name: kyverno-cloned-os-image-server-images
      namespace: "{{request.object.metadata.name}}"
      clone:
        namespace: sylva-system
        name: capm3-os-image-server-os-images
`

// kyvernoConfig is the configuration Kyverno's Helm chart installs by
// default, so that the baseline runs as deployed: the webhooks and the
// resource filters leave Kyverno's own namespace (its UpdateRequests,
// leases, events) alone. Without them, every UpdateRequest Kyverno creates
// goes through its own webhook, and under load the requests time out.
var kyvernoConfig = map[string]string{
	// Without a threshold every update request is skipped. The chart's
	// 1000 is kept: above it Kyverno stops queueing update requests, a
	// safety valve (raised, a storm of update requests overloads the
	// apiserver).
	"updateRequestThreshold": "1000",
	"resourceFilters": "[*/*,kyverno,*] [Event,*,*] [*/*,kube-system,*] [*/*,kube-public,*] [*/*,kube-node-lease,*] " +
		"[Node,*,*] [Node/?*,*,*] [APIService,*,*] [APIService/?*,*,*] [TokenReview,*,*] [SubjectAccessReview,*,*] " +
		"[SelfSubjectAccessReview,*,*] [Binding,*,*] [Pod/binding,*,*] [ReplicaSet,*,*] [ReplicaSet/?*,*,*] " +
		"[EphemeralReport,*,*] [ClusterEphemeralReport,*,*]",
	"webhooks": `{"namespaceSelector":{"matchExpressions":[{"key":"kubernetes.io/metadata.name","operator":"NotIn","values":["kube-system","kyverno"]}]}}`,
}

var clusterPolicies = schema.GroupVersionResource{Group: "kyverno.io", Version: "v1", Resource: "clusterpolicies"}

// kyvernoSystem runs Kyverno's admission and background controllers out of
// cluster, as shared/docs/kyverno-baseline.md describes, and applies the
// policy once they are up.
const kyvernoName = "kyverno 1.19.1"

func kyvernoSystem(binDir string) system {
	return system{name: kyvernoName, start: func(ctx context.Context, k *testenv.Kube, dir string) ([]*proc, error) {
		c := k.Client
		if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kyverno"}}, metav1.CreateOptions{}); err != nil {
			return nil, err
		}
		for name, data := range map[string]map[string]string{
			"kyverno":         kyvernoConfig,
			"kyverno-metrics": {},
		} {
			cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "kyverno", Name: name}, Data: data}
			if _, err := c.CoreV1().ConfigMaps("kyverno").Create(ctx, cm, metav1.CreateOptions{}); err != nil {
				return nil, err
			}
		}
		// The admission controller checks, before accepting a generate
		// policy, that the background controller's service account may
		// write the generated kind; in a cluster Kyverno's chart grants it.
		crb := &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "kyverno-bench"},
			RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "cluster-admin"},
			Subjects:   []rbacv1.Subject{{Kind: "Group", APIGroup: "rbac.authorization.k8s.io", Name: "system:serviceaccounts:kyverno"}},
		}
		if _, err := c.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{}); err != nil {
			return nil, err
		}
		if l, err := net.Listen("tcp", "127.0.0.1:9443"); err != nil {
			return nil, fmt.Errorf("Kyverno's webhook needs port 9443: %w", err)
		} else {
			l.Close()
		}
		env := []string{
			"KYVERNO_NAMESPACE=kyverno",
			"KYVERNO_SERVICEACCOUNT_NAME=kyverno-admission-controller",
			"KYVERNO_DEPLOYMENT=kyverno-admission-controller",
			"KYVERNO_POD_NAME=kyverno-bench",
			"INIT_CONFIG=kyverno",
			"METRICS_CONFIG=kyverno-metrics",
			"KYVERNO_SVC=kyverno-svc",
		}
		bg, err := startProc("background-controller", dir, true, env, filepath.Join(binDir, "background-controller"),
			"--kubeconfig", k.Kubeconfig, "--metricsPort", strconv.Itoa(freePort()))
		if err != nil {
			return nil, err
		}
		procs := []*proc{bg}
		adm, err := startProc("admission-controller", dir, true, env, filepath.Join(binDir, "kyverno"),
			"--kubeconfig", k.Kubeconfig, "--serverIP=127.0.0.1:9443", "--metricsPort", strconv.Itoa(freePort()),
			"--controllerRuntimeMetricsAddress=0",
			"--caSecretName=kyverno-svc.kyverno.svc.kyverno-tls-ca", "--tlsSecretName=kyverno-svc.kyverno.svc.kyverno-tls-pair")
		if err != nil {
			return procs, err
		}
		procs = append(procs, adm)

		dyn, err := dynamic.NewForConfig(k.Config)
		if err != nil {
			return procs, err
		}
		policy := &unstructured.Unstructured{}
		if err := yaml.Unmarshal([]byte(sylvaPolicy), &policy.Object); err != nil {
			return procs, err
		}
		// The policy is accepted once the admission webhook answers.
		var lastErr error
		deadline := time.Now().Add(3 * time.Minute)
		for {
			if err := exitedAny(procs); err != nil {
				return procs, err
			}
			if ctx.Err() != nil {
				return procs, ctx.Err()
			}
			_, lastErr = dyn.Resource(clusterPolicies).Create(ctx, policy, metav1.CreateOptions{})
			if lastErr == nil {
				break
			}
			if time.Now().After(deadline) {
				return procs, fmt.Errorf("the ClusterPolicy was not accepted within 3 minutes: %w (logs in %s)", lastErr, dir)
			}
			time.Sleep(time.Second)
		}
		for {
			if err := exitedAny(procs); err != nil {
				return procs, err
			}
			if ctx.Err() != nil {
				return procs, ctx.Err()
			}
			p, err := dyn.Resource(clusterPolicies).Get(ctx, policy.GetName(), metav1.GetOptions{})
			if err == nil && policyReady(p) {
				return procs, nil
			}
			if time.Now().After(deadline) {
				return procs, fmt.Errorf("the ClusterPolicy was not Ready within 3 minutes (logs in %s)", dir)
			}
			time.Sleep(500 * time.Millisecond)
		}
	}}
}

func policyReady(p *unstructured.Unstructured) bool {
	conds, _, _ := unstructured.NestedSlice(p.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] == "Ready" && m["status"] == "True" {
			return true
		}
	}
	return false
}

func exitedAny(procs []*proc) error {
	for _, p := range procs {
		if err := p.exited(); err != nil {
			return fmt.Errorf("%w; log in %s", err, p.logPath)
		}
	}
	return nil
}

func freePort() int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
