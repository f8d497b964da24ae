package server

import (
	"context"
	"fmt"
	"maps"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sylva-projects/osimages/internal/kube"
	"github.com/sylva-projects/osimages/internal/osimage"
	"github.com/sylva-projects/osimages/internal/serverio"
	"github.com/sylva-projects/osimages/internal/testenv"
)

// TestOutputConfigMapIsRestored: the served-set ConfigMap deleted, or
// edited, by hand is published again within seconds, not at the next
// change of the selection: the propagation copies it into every new
// workload namespace, and render checks against it. A key the server does
// not write is left alone.
func TestOutputConfigMapIsRestored(t *testing.T) {
	k := suite.Kube(t)
	ctx := context.Background()
	ns := fmt.Sprintf("output-%d", time.Now().UnixNano()%1e9)
	k.Namespace(t, ns, nil)
	key := kube.ObjectKey{Namespace: ns, Name: "capm3-os-image-server-images"}
	cms := k.Client.CoreV1().ConfigMaps(ns)

	src := newFakeSource()
	a := src.add("ubuntu-a", []byte("image a"), false)
	logs := &logLines{}
	h := start(t, t.TempDir(), src, func(c *Config) {
		c.Publisher = serverio.ConfigMapPublisher{Client: k.Client, Key: key}
		c.Logger = logs.logger()
	})
	h.want(a)
	published := waitConfigMap(t, k, key, "the image published available", func(cm *corev1.ConfigMap) bool {
		s, err := osimage.ParseServed([]byte(cm.Data[osimage.ValuesKey]))
		return err == nil && s[a.SHA256].Available
	})

	if err := cms.Delete(ctx, key.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitConfigMap(t, k, key, "the deleted ConfigMap published again", func(cm *corev1.ConfigMap) bool {
		return maps.Equal(cm.Data, published.Data)
	})
	if logs.count("the published served set was deleted; publishing it again") == 0 {
		t.Errorf("no log line says why the output was written again:\n%s", logs)
	}

	// Edited by hand: the server's keys are written back, another's kept.
	cm, err := cms.Get(ctx, key.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cm.Data[osimage.ValuesKey] = "os_image_server_images: {}\n"
	cm.Data["note"] = "added by hand"
	if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitConfigMap(t, k, key, "the edited ConfigMap published again", func(cm *corev1.ConfigMap) bool {
		return cm.Data[osimage.ValuesKey] == published.Data[osimage.ValuesKey]
	})
	if got, _ := cms.Get(ctx, key.Name, metav1.GetOptions{}); got == nil || got.Data["note"] != "added by hand" {
		t.Errorf("a key the server does not write was removed: %v", got)
	}
	if logs.count("the published served set was changed by another writer; publishing it again") == 0 {
		t.Errorf("no log line says why the output was written again:\n%s", logs)
	}
}

// waitConfigMap waits until the ConfigMap key exists and satisfies cond.
func waitConfigMap(t *testing.T, k *testenv.Kube, key kube.ObjectKey, what string, cond func(*corev1.ConfigMap) bool) *corev1.ConfigMap {
	t.Helper()
	var last *corev1.ConfigMap
	// Seconds are promised; the deadline leaves room for a busy machine.
	testenv.Eventually(t, what, 30*time.Second, func() (bool, string) {
		cm, err := k.Client.CoreV1().ConfigMaps(key.Namespace).Get(context.Background(), key.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, "absent"
		}
		if err != nil {
			return false, err.Error()
		}
		last = cm
		return cond(cm), fmt.Sprint(cm.Data)
	})
	return last
}
