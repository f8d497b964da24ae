package propagate

import (
	"context"
	"fmt"
	"maps"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A ConfigMap that carries the propagation's labels, and even the
// annotations of a real copy, in a namespace the rule does not select is
// not deleted: the labels are no proof, and the proof of another
// namespace's copy does not hold in this one. A real copy still goes when
// its namespace loses the label.
func TestDeleteNeedsProofOfOwnership(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.writeSource("v1")
	mine, forgedNS := e.ns("proof-copy"), e.ns("proof-forged")
	e.createNamespace(mine, true)
	e.createNamespace(forgedNS, false)
	ctl := e.start(Options{})
	e.waitCopies([]string{mine}, "v1", settle)

	// The tenant of proof-forged copies a real copy's marks onto its own
	// ConfigMap.
	real := e.getCopy(mine)
	forged := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: forgedNS, Name: e.rule.Target, Labels: maps.Clone(real.Labels), Annotations: maps.Clone(real.Annotations)},
		Data:       map[string]string{"values.yaml": "mine"},
	}
	if err := e.c.Create(ctx, forged); err != nil {
		t.Fatal(err)
	}
	eventually(t, settle, func() error {
		if len(e.events(forgedNS, "ConfigMap", e.rule.Target)["OwnershipUnproven"]) == 0 {
			return fmt.Errorf("no OwnershipUnproven event")
		}
		return nil
	})
	// A namespace event replays the decision: still not deleted.
	e.setLabel(forgedNS, false)
	e.writeSource("v2")
	eventually(t, settle, func() error {
		if cp := e.getCopy(mine); cp == nil || cp.Data["values.yaml"] != "v2" {
			return fmt.Errorf("proof-copy not at v2: %v", cp)
		}
		return nil
	})
	if got := e.getCopy(forgedNS); got == nil || got.UID != forged.UID || got.Data["values.yaml"] != "mine" {
		t.Fatalf("the tenant's ConfigMap was deleted or written: %v", got)
	}
	if got := ctl.copies(t, e.rule.Name, StateConflict); got != 1 {
		t.Errorf("conflict metric %v", got)
	}

	// A real copy is still deleted when its namespace leaves the rule.
	e.setLabel(mine, false)
	eventually(t, settle, func() error {
		if e.getCopy(mine) != nil {
			return fmt.Errorf("the real copy is still there")
		}
		return nil
	})
}
