package chart

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/sylva-projects/osimages/internal/testenv"
)

// TestDeleteGuard installs the chart's objects and acts as the fleet
// controller's account against the real apiserver and its
// ValidatingAdmissionPolicy. The guard trusts the rule label to allow a
// delete, so the account may not put that label on a ConfigMap it did not
// create: it did, by adopting an unlabelled kube-system ConfigMap, and then
// deleted it.
func TestDeleteGuard(t *testing.T) {
	k := apiserver(t)
	ctx := context.Background()
	const ns, target, rule = "guard", "kyverno-cloned-os-image-server-images", "propagate.osimages.sylva-project.org/rule"
	ensureNamespace(t, k, ns, nil)
	vals, err := LoadValues([]byte("os_image_selectors:\n- {os: ubuntu}\n"))
	if err != nil {
		t.Fatal(err)
	}
	r, err := Render(chartDir, Release{Name: "osimages", Namespace: ns}, vals)
	if err != nil {
		t.Fatal(err)
	}
	if err := newApplier(t, k.Config).apply(ctx, r.Objects, false); err != nil {
		t.Fatalf("installing the chart's objects: %v", err)
	}
	_, cfg := serviceAccountKubeconfig(t, k, ns, "osimages-controller")
	controller := kubernetes.NewForConfigOrDie(cfg)

	// A ConfigMap of a copy's name that osimages did not make, where the
	// controller's ClusterRole reaches it.
	victim := func(namespace, name string, labels map[string]string) {
		t.Helper()
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: labels}, Data: map[string]string{"keep": "me"}}
		// Another test of the package may have left one of that name.
		if err := k.Client.CoreV1().ConfigMaps(namespace).Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
		if _, err := k.Client.CoreV1().ConfigMaps(namespace).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	labelPatch := func(value string) []byte {
		return []byte(fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, rule, value))
	}
	victim("kube-system", target, nil)
	// The apiserver takes a new policy in a moment later, not at once:
	// wait for it with dry runs (admission runs, nothing is written).
	testenv.Eventually(t, "the guard refuses the controller's labelling", 30*time.Second, func() (bool, string) {
		_, err := controller.CoreV1().ConfigMaps("kube-system").Patch(ctx, target, types.MergePatchType, labelPatch("os-image-server-images"), metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}})
		return apierrors.IsForbidden(err), fmt.Sprint(err)
	})
	_, err = controller.CoreV1().ConfigMaps("kube-system").Patch(ctx, target, types.MergePatchType, labelPatch("os-image-server-images"), metav1.PatchOptions{})
	if !contains(fmt.Sprint(err), "does not carry propagate.osimages.sylva-project.org/rule=os-image-server-images",
		"label it yourself: kubectl -n kube-system label configmap "+target+" "+rule+"=os-image-server-images") {
		t.Errorf("the refusal does not say why and what to do: %v", err)
	}
	// Neither by a full update (server-side apply is a patch too).
	cm, err := controller.CoreV1().ConfigMaps("kube-system").Get(ctx, target, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cm.Labels = map[string]string{rule: "os-image-server-images"}
	_, err = controller.CoreV1().ConfigMaps("kube-system").Update(ctx, cm, metav1.UpdateOptions{})
	wantForbidden(t, "controller labels kube-system/"+target+" by update", err)
	// So it stays unlabelled, and its delete is refused.
	if cm, err := k.Client.CoreV1().ConfigMaps("kube-system").Get(ctx, target, metav1.GetOptions{}); err != nil || cm.Labels[rule] != "" {
		t.Errorf("kube-system/%s after the refusals: %v, labels %v", target, err, cm.Labels)
	}
	err = controller.CoreV1().ConfigMaps("kube-system").Delete(ctx, target, metav1.DeleteOptions{})
	wantForbidden(t, "controller deletes kube-system/"+target, err)

	// A copy may not be moved to another rule either.
	ensureNamespace(t, k, "guard-wc", nil)
	victim("guard-wc", target, map[string]string{rule: "another-rule"})
	_, err = controller.CoreV1().ConfigMaps("guard-wc").Patch(ctx, target, types.MergePatchType, labelPatch("os-image-server-images"), metav1.PatchOptions{})
	wantForbidden(t, "controller relabels a ConfigMap of another rule", err)

	// What propagation does stays allowed: create a copy, update it,
	// delete it.
	ensureNamespace(t, k, "guard-wc2", nil)
	created, err := controller.CoreV1().ConfigMaps("guard-wc2").Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: target, Labels: map[string]string{rule: "os-image-server-images"}}, Data: map[string]string{"values.yaml": "a"},
	}, metav1.CreateOptions{})
	wantAllowed(t, "controller creates its copy", err)
	if err == nil {
		created.Data["values.yaml"] = "b"
		created.Labels["propagate.osimages.sylva-project.org/source-name"] = "capm3-os-image-server-os-images"
		_, err = controller.CoreV1().ConfigMaps("guard-wc2").Update(ctx, created, metav1.UpdateOptions{})
		wantAllowed(t, "controller updates its copy", err)
		wantAllowed(t, "controller deletes its copy", controller.CoreV1().ConfigMaps("guard-wc2").Delete(ctx, target, metav1.DeleteOptions{}))
	}
	// An update that leaves the label off is no labelling.
	_, err = controller.CoreV1().ConfigMaps("kube-system").Patch(ctx, target, types.MergePatchType, []byte(`{"data":{"keep":"me"}}`), metav1.PatchOptions{})
	if apierrors.IsForbidden(err) && strings.Contains(err.Error(), "does not carry") {
		t.Errorf("an update without the label is refused as a labelling: %v", err)
	}

	// A person hands the ConfigMap over by labelling it: the guard does
	// not concern other users, and then osimages may delete it.
	if _, err := k.Client.CoreV1().ConfigMaps("kube-system").Patch(ctx, target, types.MergePatchType, labelPatch("os-image-server-images"), metav1.PatchOptions{}); err != nil {
		t.Fatalf("the admin labels kube-system/%s: %v", target, err)
	}
	wantAllowed(t, "controller deletes what a person handed over", controller.CoreV1().ConfigMaps("kube-system").Delete(ctx, target, metav1.DeleteOptions{}))
}
