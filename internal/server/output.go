package server

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/sylva-projects/osimages/internal/kube"
	"github.com/sylva-projects/osimages/internal/osimage"
)

// FilePublisher writes the served-set document (the values.yaml of contract
// §6) to a file, atomically, so that a reader never sees half of it. The
// file can be passed as is to `osimages render -f`.
type FilePublisher struct{ Path string }

// Publish implements Publisher.
func (p FilePublisher) Publish(_ context.Context, served osimage.ServedSet) error {
	doc, err := osimage.MarshalServed(served)
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(p.Path), "."+filepath.Base(p.Path)+".*")
	if err != nil {
		return fmt.Errorf("writing %s: %w", p.Path, err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(doc); err != nil {
		tmp.Close()
		return fmt.Errorf("writing %s: %w", p.Path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("writing %s: %w", p.Path, err)
	}
	if err := os.Rename(tmp.Name(), p.Path); err != nil {
		return fmt.Errorf("writing %s: %w", p.Path, err)
	}
	return nil
}

// ConfigMapPublisher applies the served-images ConfigMap with server-side
// apply.
type ConfigMapPublisher struct {
	Client kubernetes.Interface
	Key    kube.ObjectKey
}

// Publish implements Publisher.
func (p ConfigMapPublisher) Publish(ctx context.Context, served osimage.ServedSet) error {
	doc, err := osimage.MarshalServed(served)
	if err != nil {
		return err
	}
	_, err = kube.ApplyConfigMap(ctx, p.Client, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: p.Key.Name, Namespace: p.Key.Namespace},
		Data:       map[string]string{osimage.ValuesKey: string(doc)},
	})
	return err
}
