package node

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestContainerEnv(t *testing.T) {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "vm-a", Namespace: "ns", UID: "u1"},
		Spec:       corev1.PodSpec{NodeName: "node-1", ServiceAccountName: "default"},
	}
	field := func(path string) *corev1.EnvVarSource {
		return &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: path}}
	}
	defaults := []string{"PATH=" + defaultPath, "HOSTNAME=vm-a", "HOME=/root"}
	for _, tc := range []struct {
		name    string
		env     []corev1.EnvVar
		envFrom []corev1.EnvFromSource
		want    []string
		wantErr bool
	}{{
		name: "the runtime's defaults",
		want: defaults,
	}, {
		name: "plain values and the downward API",
		env: []corev1.EnvVar{
			{Name: "MODE", Value: "test"},
			{Name: "POD_NAME", ValueFrom: field("metadata.name")},
			{Name: "POD_NAMESPACE", ValueFrom: field("metadata.namespace")},
			{Name: "POD_UID", ValueFrom: field("metadata.uid")},
			{Name: "NODE_NAME", ValueFrom: field("spec.nodeName")},
			{Name: "POD_IP", ValueFrom: field("status.podIP")},
			{Name: "HOST_IP", ValueFrom: field("status.hostIP")},
			{Name: "SA", ValueFrom: field("spec.serviceAccountName")},
		},
		want: append(defaults[:3:3], "MODE=test", "POD_NAME=vm-a", "POD_NAMESPACE=ns", "POD_UID=u1",
			"NODE_NAME=node-1", "POD_IP=127.0.0.11", "HOST_IP=127.0.0.11", "SA=default"),
	}, {
		name: "references to earlier variables expand, others stay",
		env: []corev1.EnvVar{
			{Name: "POD_NAME", ValueFrom: field("metadata.name")},
			{Name: "SOCKET", Value: "/var/run/lifeboat/$(POD_NAME)/sock"},
			{Name: "LATER", Value: "$(NEXT) $$(POD_NAME)"},
			{Name: "NEXT", Value: "n"},
		},
		want: append(defaults[:3:3], "POD_NAME=vm-a", "SOCKET=/var/run/lifeboat/vm-a/sock", "LATER=$(NEXT) $(POD_NAME)", "NEXT=n"),
	}, {
		name: "a container's PATH replaces the default in place",
		env:  []corev1.EnvVar{{Name: "PATH", Value: "/opt/bin:$(PATH)"}},
		want: []string{"PATH=/opt/bin:" + defaultPath, "HOSTNAME=vm-a", "HOME=/root"},
	}, {
		name:    "envFrom is refused",
		envFrom: []corev1.EnvFromSource{{ConfigMapRef: &corev1.ConfigMapEnvSource{}}},
		wantErr: true,
	}, {
		name:    "values from ConfigMaps are refused",
		env:     []corev1.EnvVar{{Name: "X", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{}}}},
		wantErr: true,
	}, {
		name:    "other fields are refused",
		env:     []corev1.EnvVar{{Name: "X", ValueFrom: field("metadata.labels['app']")}},
		wantErr: true,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := containerEnv(pod, &corev1.Container{Env: tc.env, EnvFrom: tc.envFrom}, "127.0.0.11", "127.0.0.11")
			if (err != nil) != tc.wantErr {
				t.Fatalf("error = %v, want an error: %v", err, tc.wantErr)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("env (-want +got):\n%s", diff)
			}
		})
	}
}

func TestExpand(t *testing.T) {
	vars := map[string]string{"A": "a", "EMPTY": ""}
	lookup := func(name string) (string, bool) {
		v, ok := vars[name]
		return v, ok
	}
	for _, tc := range []struct {
		name, in, want string
	}{
		{"no reference", "plain", "plain"},
		{"a reference", "x-$(A)-y", "x-a-y"},
		{"an empty value", "[$(EMPTY)]", "[]"},
		{"an unknown name stays", "$(B)", "$(B)"},
		{"$$ escapes", "$$(A) $$", "$(A) $"},
		{"a lone $ stays", "cost: $5 and $", "cost: $5 and $"},
		{"an unclosed reference stays, the rest expands", "$(A $$ $(A", "$(A $ $(A"},
		{"a closer ends the first reference", "$(A)$(A))", "aa)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := expand(tc.in, lookup); got != tc.want {
				t.Errorf("expand(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}
