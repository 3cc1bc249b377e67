package node

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

func TestEvictionMessage(t *testing.T) {
	container := func(name, request string) corev1.Container {
		c := corev1.Container{Name: name}
		if request != "" {
			c.Resources.Requests = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse(request)}
		}
		return c
	}
	q := resource.MustParse
	for _, tc := range []struct {
		name            string
		containers      []corev1.Container
		usage           map[string]resource.Quantity
		wantMessage     string
		wantAnnotations map[string]string
	}{{
		name:       "a container over its request",
		containers: []corev1.Container{container("launcher", "128Mi")},
		usage:      map[string]resource.Quantity{"launcher": q("900Mi")},
		wantMessage: "The node was low on resource: memory. Threshold quantity: 500Mi, available: 300Mi. " +
			"Container launcher was using 900Mi, request is 128Mi, has larger consumption of memory. ",
		wantAnnotations: map[string]string{"offending_containers": "launcher", "offending_containers_usage": "900Mi", "starved_resource": "memory"},
	}, {
		name:            "a container within its request is not blamed",
		containers:      []corev1.Container{container("launcher", "1Gi")},
		usage:           map[string]resource.Quantity{"launcher": q("900Mi")},
		wantMessage:     "The node was low on resource: memory. Threshold quantity: 500Mi, available: 300Mi. ",
		wantAnnotations: map[string]string{"offending_containers": "", "offending_containers_usage": "", "starved_resource": "memory"},
	}, {
		name:       "no request counts as zero; containers without figures are left out",
		containers: []corev1.Container{container("a", ""), container("b", ""), container("c", "")},
		usage:      map[string]resource.Quantity{"a": q("1Mi"), "c": *resource.NewQuantity(123456789, resource.BinarySI)},
		wantMessage: "The node was low on resource: memory. Threshold quantity: 500Mi, available: 300Mi. " +
			"Container a was using 1Mi, request is 0, has larger consumption of memory. " +
			"Container c was using 123456789, request is 0, has larger consumption of memory. ",
		wantAnnotations: map[string]string{"offending_containers": "a,c", "offending_containers_usage": "1Mi,123456789", "starved_resource": "memory"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			pod := &corev1.Pod{Spec: corev1.PodSpec{Containers: tc.containers}}
			message, annotations := evictionMessage(pod, q("500Mi"), q("300Mi"), tc.usage)
			if message != tc.wantMessage {
				t.Errorf("message\n got %q\nwant %q", message, tc.wantMessage)
			}
			if diff := cmp.Diff(tc.wantAnnotations, annotations); diff != "" {
				t.Errorf("annotations (-want +got):\n%s", diff)
			}
		})
	}
}
