package main

import (
	"context"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/sylva-projects/osimages/internal/kube"
	"github.com/sylva-projects/osimages/internal/osimage"
)

// kubeTarget is the cluster a command reads from or writes to.
type kubeTarget struct {
	config *rest.Config
	client kubernetes.Interface
}

func newKubeTarget(kubeconfig string) (*kubeTarget, error) {
	cfg, err := kube.RESTConfig(kubeconfig)
	if err != nil {
		return nil, err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return &kubeTarget{config: cfg, client: client}, nil
}

// configMapValues reads the values.yaml document of ConfigMap NS/NAME.
func (k *kubeTarget) configMapValues(ctx context.Context, nsName string) ([]byte, error) {
	key, err := kube.ParseObjectKey(nsName)
	if err != nil {
		return nil, err
	}
	return kube.ConfigMapValues(ctx, k.client, key, osimage.ValuesKey)
}
