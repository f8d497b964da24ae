package replica

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/utils/ptr"
)

func TestReadyEndpoints(t *testing.T) {
	ep := func(id, addr string, ready, terminating *bool) discoveryv1.Endpoint {
		return discoveryv1.Endpoint{Addresses: []string{addr}, TargetRef: &corev1.ObjectReference{Kind: "Pod", Name: id},
			Conditions: discoveryv1.EndpointConditions{Ready: ready, Terminating: terminating}}
	}
	slice := &discoveryv1.EndpointSlice{
		Ports: []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080)}, {Name: ptr.To("peer"), Port: ptr.To[int32](8081)}},
		Endpoints: []discoveryv1.Endpoint{
			ep("self", "10.0.0.1", ptr.To(true), nil),
			ep("b", "10.0.0.3", nil, nil), // no condition: ready
			ep("a", "10.0.0.2", ptr.To(true), nil),
			ep("c", "10.0.0.4", ptr.To(false), nil),
			ep("d", "10.0.0.5", ptr.To(true), ptr.To(true)),
		},
	}
	noPeerPort := &discoveryv1.EndpointSlice{
		Ports:     []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080)}},
		Endpoints: []discoveryv1.Endpoint{ep("e", "10.0.0.6", ptr.To(true), nil)},
	}
	got, selfReady := ReadyEndpoints([]*discoveryv1.EndpointSlice{slice, noPeerPort}, "self")
	want := []Peer{{ID: "a", URL: "http://10.0.0.2:8081"}, {ID: "b", URL: "http://10.0.0.3:8081"}}
	if !slices.Equal(got, want) || !selfReady {
		t.Fatalf("got %v (self ready %v), want %v", got, selfReady, want)
	}
	if _, selfReady := ReadyEndpoints([]*discoveryv1.EndpointSlice{noPeerPort}, "self"); selfReady {
		t.Fatal("self is not listed, yet ready")
	}
}
