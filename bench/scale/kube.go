package main

import (
	"context"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/sylva-projects/osimages/internal/osimage"
)

func setupKube(ctx context.Context, cs kubernetes.Interface) error {
	_, err := cs.CoreV1().Services(namespace).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: headless},
		Spec: corev1.ServiceSpec{ClusterIP: corev1.ClusterIPNone, Selector: map[string]string{"app.kubernetes.io/component": "server"},
			Ports: []corev1.ServicePort{{Name: "http", Port: 8080}, {Name: "peer", Port: 8081}}},
	}, metav1.CreateOptions{})
	return err
}

// reset leaves the apiserver as a fresh install would: no output, no
// Lease, no EndpointSlice, and the catalog without data (the replicas
// wait for it) or, with info, already selecting the image.
func reset(ctx context.Context, cs kubernetes.Interface, info string) error {
	cms := cs.CoreV1().ConfigMaps(namespace)
	for _, name := range []string{osimage.InfoConfigMapName, osimage.ServedConfigMapName} {
		if err := cms.Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	}
	if err := cs.CoordinationV1().Leases(namespace).Delete(ctx, lease, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	if err := cs.DiscoveryV1().EndpointSlices(namespace).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + headless}); err != nil {
		return err
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: osimage.InfoConfigMapName}}
	if info != "" {
		cm.Data = map[string]string{osimage.ValuesKey: info}
	}
	_, err := cms.Create(ctx, cm, metav1.CreateOptions{})
	return err
}

// selectImage gives the catalog its data: the image that the values
// select.
func selectImage(ctx context.Context, cs kubernetes.Interface, info string) error {
	_, err := cs.CoreV1().ConfigMaps(namespace).Update(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: osimage.InfoConfigMapName},
		Data:       map[string]string{osimage.ValuesKey: info},
	}, metav1.UpdateOptions{})
	return err
}

// available says whether the output ConfigMap says available: true of
// the image.
func available(ctx context.Context, cs kubernetes.Interface, sha osimage.SHA256) bool {
	cm, err := cs.CoreV1().ConfigMaps(namespace).Get(ctx, osimage.ServedConfigMapName, metav1.GetOptions{})
	if err != nil {
		return false
	}
	served, err := osimage.ParseServed([]byte(cm.Data[osimage.ValuesKey]))
	return err == nil && served[sha].Available
}

// endpointSlice lists replica r as an endpoint of the headless Service,
// with its own ports (the replicas share lo's addresses), as the
// endpointslice controller would: not ready while the pod starts, ready
// once its readiness probe passes.
func endpointSlice(r *replica, ready bool) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: headless + "-" + strconv.Itoa(r.index), Labels: map[string]string{discoveryv1.LabelServiceName: headless}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{
			Addresses:  []string{loAddress},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(ready), Serving: ptr.To(ready), Terminating: ptr.To(false)},
			Hostname:   ptr.To(r.id),
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: namespace, Name: r.id},
		}},
		Ports: []discoveryv1.EndpointPort{
			{Name: ptr.To("http"), Port: ptr.To(int32(clientPort + r.index)), Protocol: ptr.To(corev1.ProtocolTCP)},
			{Name: ptr.To("peer"), Port: ptr.To(int32(peerPort + r.index)), Protocol: ptr.To(corev1.ProtocolTCP)},
		},
	}
}

// listEndpoint creates or replaces r's EndpointSlice.
func listEndpoint(ctx context.Context, cs kubernetes.Interface, r *replica, ready bool) error {
	slices := cs.DiscoveryV1().EndpointSlices(namespace)
	es := endpointSlice(r, ready)
	_, err := slices.Create(ctx, es, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		old, gerr := slices.Get(ctx, es.Name, metav1.GetOptions{})
		if gerr != nil {
			return gerr
		}
		es.ResourceVersion = old.ResourceVersion
		_, err = slices.Update(ctx, es, metav1.UpdateOptions{})
	}
	return err
}
