package chart

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// checkServerReplicas holds the "server-replicas" variant (server.replicas:
// 3) to the contract between the chart and `osimages serve`: the flags, the
// ports by name, the Services, spreading, the budget, the peers' Role and
// the NetworkPolicy.
func checkServerReplicas(t *testing.T, r *Rendered) {
	t.Helper()
	sts := r.Find("StatefulSet", "osimages-server")
	if n, _, _ := unstructured.NestedFieldNoCopy(sts.Object, "spec", "replicas"); fmt.Sprint(n) != "3" {
		t.Errorf("StatefulSet replicas %d, want 3", n)
	}
	c := container(t, sts)
	args := stringsOf(c["args"])
	for _, want := range []string{"--replica-id=$(POD_NAME)", "--peers-service=osimages-server-headless", "--peer-listen=:8081", "--publisher-lease=osimages-server-publisher", "--replicas=$(OSIMAGES_REPLICAS)", "--claim-wait=10s"} {
		if !slices.Contains(args, want) {
			t.Errorf("server args lack %s: %v", want, args)
		}
	}
	env := toYAML(t, &unstructured.Unstructured{Object: map[string]any{"env": c["env"]}})
	if !contains(env, "name: POD_NAME", "fieldPath: metadata.name") {
		t.Errorf("POD_NAME does not come from the pod's name:\n%s", env)
	}
	// The count the replicas expect comes from a ConfigMap, not the pod
	// template (TestServerPodSameForEveryReplicaCount).
	if !contains(env, "name: OSIMAGES_REPLICAS", "name: osimages-server-values", "key: replicas") {
		t.Errorf("OSIMAGES_REPLICAS does not come from the server's ConfigMap:\n%s", env)
	}
	if n, _, _ := unstructured.NestedString(r.Find("ConfigMap", "osimages-server-values").Object, "data", "replicas"); n != "3" {
		t.Errorf("the server's ConfigMap says replicas %q, want 3", n)
	}
	if !contains(toYAML(t, &unstructured.Unstructured{Object: map[string]any{"ports": c["ports"]}}), "name: peer", "containerPort: 8081") {
		t.Error("the container has no port named peer on 8081")
	}

	portNames := func(svc *unstructured.Unstructured) []string {
		ports, _, _ := unstructured.NestedSlice(svc.Object, "spec", "ports")
		var names []string
		for _, p := range ports {
			names = append(names, p.(map[string]any)["name"].(string))
		}
		return names
	}
	headless := r.Find("Service", "osimages-server-headless")
	if got := portNames(headless); !slices.Equal(got, []string{"http", "peer"}) {
		t.Errorf("headless Service ports %v, want [http peer]", got)
	}
	// Peers are the ready replicas: a starting one must not be listed
	// as ready in the EndpointSlices.
	if pub, found, _ := unstructured.NestedBool(headless.Object, "spec", "publishNotReadyAddresses"); !found || pub {
		t.Error("the headless Service publishes replicas that are not ready")
	}
	if got := portNames(r.Find("Service", "osimages-server")); !slices.Equal(got, []string{"http"}) {
		t.Errorf("client Service ports %v, want [http] only", got)
	}

	spec, _, _ := unstructured.NestedMap(sts.Object, "spec", "template", "spec")
	aff := toYAML(t, &unstructured.Unstructured{Object: map[string]any{"affinity": spec["affinity"]}})
	if !contains(aff, "podAntiAffinity", "preferredDuringSchedulingIgnoredDuringExecution", "topologyKey: kubernetes.io/hostname", "app.kubernetes.io/component: server") || strings.Contains(aff, "requiredDuring") {
		t.Errorf("replicas are not spread softly over nodes by default:\n%s", aff)
	}
	if tsc, _ := spec["topologySpreadConstraints"].([]any); len(tsc) != 1 {
		t.Errorf("topologySpreadConstraints %v, want the one given", spec["topologySpreadConstraints"])
	}

	pdb := r.Find("PodDisruptionBudget", "osimages-server")
	if pdb == nil {
		t.Fatal("no PodDisruptionBudget for 3 server replicas")
	}
	if v, _, _ := unstructured.NestedFieldNoCopy(pdb.Object, "spec", "maxUnavailable"); fmt.Sprint(v) != "1" {
		t.Errorf("server PDB maxUnavailable %v, want 1", v)
	}

	// The peers' Role: exactly the Lease by name (create cannot be named),
	// EndpointSlices read-only, events; nothing else.
	role := r.Find("Role", "osimages-server-peers")
	if role == nil || role.GetNamespace() != "sylva-system" {
		t.Fatalf("peers Role %v, want it in the release namespace", role)
	}
	rules, _, _ := unstructured.NestedSlice(role.Object, "rules")
	var got []string
	for _, rule := range rules {
		rm := rule.(map[string]any)
		names := ""
		if rm["resourceNames"] != nil {
			names = "/" + strings.Join(stringsOf(rm["resourceNames"]), ",")
		}
		got = append(got, strings.Join(stringsOf(rm["resources"]), ",")+names+":"+strings.Join(stringsOf(rm["verbs"]), ","))
	}
	want := []string{"leases/osimages-server-publisher:get,update", "leases:create", "endpointslices:get,list,watch", "events:create,patch"}
	if !slices.Equal(got, want) {
		t.Errorf("peers Role rules %v, want %v", got, want)
	}

	// The peer port: in from the server's own pods only, and out to them.
	np := toYAML(t, r.Find("NetworkPolicy", "osimages-server"))
	ingress, _, _ := unstructured.NestedSlice(r.Find("NetworkPolicy", "osimages-server").Object, "spec", "ingress")
	var peerFrom []any
	for _, rule := range ingress {
		rm := rule.(map[string]any)
		if strings.Contains(toYAML(t, &unstructured.Unstructured{Object: map[string]any{"p": rm["ports"]}}), "port: peer") {
			peerFrom, _ = rm["from"].([]any)
		}
	}
	if len(peerFrom) != 1 || !strings.Contains(toYAML(t, &unstructured.Unstructured{Object: map[string]any{"from": peerFrom}}), "app.kubernetes.io/component: server") {
		t.Errorf("the peer port is open to %v, want the server's pods only:\n%s", peerFrom, np)
	}
}

// TestServerReplicasRBAC installs the chart with server.replicas: 3 and acts
// as the server's ServiceAccount: it may elect the publisher with its own
// Lease, find its peers in the EndpointSlices of its namespace and report a
// bad peer in an event, and nothing more: no other Lease, no EndpointSlice
// elsewhere or written, no Secret. One replica gets the same.
func TestServerReplicasRBAC(t *testing.T) {
	k := apiserver(t)
	ctx := context.Background()
	install := func(t *testing.T, ns, vals string) (kubernetes.Interface, *rest.Config) {
		t.Helper()
		ensureNamespace(t, k, ns, nil)
		v, err := LoadValues([]byte(vals))
		if err != nil {
			t.Fatal(err)
		}
		r, err := Render(chartDir, Release{Name: "osimages", Namespace: ns}, v)
		if err != nil {
			t.Fatal(err)
		}
		if err := newApplier(t, k.Config).apply(ctx, r.Objects, false); err != nil {
			t.Fatalf("installing the chart's objects: %v", err)
		}
		_, cfg := serviceAccountKubeconfig(t, k, ns, "osimages-server")
		return kubernetes.NewForConfigOrDie(cfg), cfg
	}
	const elsewhere = "default"

	t.Run("replicas 3", func(t *testing.T) {
		const ns = "osimages-scale"
		cs, cfg := install(t, ns, "server: {replicas: 3}\ncontroller: {enabled: false}\n")
		other, err := k.Client.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "someone-elses"}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}

		// The publisher election, as client-go's leaderelection does it.
		leases := cs.CoordinationV1().Leases(ns)
		holder := "osimages-server-0"
		l, err := leases.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "osimages-server-publisher"}, Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder}}, metav1.CreateOptions{})
		wantAllowed(t, "server creates its publisher Lease", err)
		if err == nil {
			l, err = leases.Get(ctx, l.Name, metav1.GetOptions{})
			wantAllowed(t, "server gets its publisher Lease", err)
			holder = "osimages-server-1"
			l.Spec.HolderIdentity = &holder
			_, err = leases.Update(ctx, l, metav1.UpdateOptions{})
			wantAllowed(t, "server updates its publisher Lease", err)
		}
		if _, err := k.Client.CoordinationV1().Leases(ns).Create(ctx, leaseNamed("osimages-controller"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		_, err = leases.Get(ctx, "osimages-controller", metav1.GetOptions{})
		wantForbidden(t, "server gets another Lease of its namespace", err)
		_, err = leases.Update(ctx, leaseNamed("osimages-controller"), metav1.UpdateOptions{})
		wantForbidden(t, "server updates another Lease of its namespace", err)
		_, err = leases.List(ctx, metav1.ListOptions{})
		wantForbidden(t, "server lists the Leases of its namespace", err)
		_, err = cs.CoordinationV1().Leases(elsewhere).Create(ctx, leaseNamed("osimages-server-publisher"), metav1.CreateOptions{})
		wantForbidden(t, "server creates a Lease in another namespace", err)
		_, err = cs.CoordinationV1().Leases(elsewhere).Get(ctx, "osimages-server-publisher", metav1.GetOptions{})
		wantForbidden(t, "server gets a Lease in another namespace", err)

		// Peer discovery: the headless Service's EndpointSlices, read-only.
		slices := cs.DiscoveryV1().EndpointSlices(ns)
		_, err = slices.List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=osimages-server-headless"})
		wantAllowed(t, "server lists the EndpointSlices of its namespace", err)
		w, err := slices.Watch(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=osimages-server-headless"})
		wantAllowed(t, "server watches the EndpointSlices of its namespace", err)
		if err == nil {
			w.Stop()
		}
		_, err = slices.Create(ctx, &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "planted"}, AddressType: discoveryv1.AddressTypeIPv4}, metav1.CreateOptions{})
		wantForbidden(t, "server creates an EndpointSlice", err)
		_, err = cs.DiscoveryV1().EndpointSlices(elsewhere).List(ctx, metav1.ListOptions{})
		wantForbidden(t, "server lists EndpointSlices of another namespace", err)

		// A bad peer is reported in an event of its namespace.
		_, err = cs.CoreV1().Events(ns).Create(ctx, &corev1.Event{
			ObjectMeta:     metav1.ObjectMeta{Name: "osimages-server-0.bad-peer"},
			InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: "osimages-server-0"},
			Reason:         "PeerSentBadBytes", Message: "test", Type: corev1.EventTypeWarning,
		}, metav1.CreateOptions{})
		wantAllowed(t, "server records an event in its namespace", err)
		_, err = cs.CoreV1().Events(elsewhere).Create(ctx, &corev1.Event{
			ObjectMeta:     metav1.ObjectMeta{Name: "x"},
			InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: elsewhere, Name: "x"},
		}, metav1.CreateOptions{})
		wantForbidden(t, "server records an event in another namespace", err)

		outOfScope(t, cfg, ns, other.Name, false)
	})

	t.Run("one replica gets the same", func(t *testing.T) {
		const ns = "osimages-single"
		cs, _ := install(t, ns, "controller: {enabled: false}\n")
		_, err := cs.CoordinationV1().Leases(ns).Create(ctx, leaseNamed("osimages-server-publisher"), metav1.CreateOptions{})
		wantAllowed(t, "one replica creates the publisher Lease", err)
		_, err = cs.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{})
		wantAllowed(t, "one replica lists EndpointSlices", err)
	})
}

// TestServerPodSameForEveryReplicaCount holds the server's pod template
// to one shape whatever server.replicas: scaling (1 -> 3, 3 -> 1) changes
// the count and nothing else, so that the running replica is not
// restarted in the middle of it. In a real cluster (make e2e, scenario
// Replicas), a template that changed with the count restarted
// osimages-server-0 in single mode while -1 started as a peer: the
// registry sent the new image twice, -1 pulled what -0 held, and the
// output flapped to unavailable between two publishers.
func TestServerPodSameForEveryReplicaCount(t *testing.T) {
	template := func(n int) string {
		r, err := Render(chartDir, Release{Name: "osimages", Namespace: "sylva-system"}, map[string]any{"server": map[string]any{"replicas": n}})
		if err != nil {
			t.Fatal(err)
		}
		tpl, _, _ := unstructured.NestedMap(r.Find("StatefulSet", "osimages-server").Object, "spec", "template")
		return toYAML(t, &unstructured.Unstructured{Object: tpl})
	}
	one := template(1)
	for _, n := range []int{2, 3, 5} {
		if got := template(n); got != one {
			t.Errorf("the server's pod template with %d replicas differs from one replica's:\n--- 1\n%s\n--- %d\n%s", n, one, n, got)
		}
	}
}
