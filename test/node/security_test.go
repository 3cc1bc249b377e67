package node

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
)

func TestContainerCredentials(t *testing.T) {
	tests := []struct {
		name      string
		pod       *corev1.PodSecurityContext
		container *corev1.SecurityContext
		want      credentials
		refused   bool
	}{
		{name: "nothing set: root, as an image without USER"},
		{name: "the pod's user, group, fsGroup and supplemental groups",
			pod:  &corev1.PodSecurityContext{RunAsUser: ptr.To[int64](107), RunAsGroup: ptr.To[int64](108), FSGroup: ptr.To[int64](109), SupplementalGroups: []int64{110}},
			want: credentials{UID: 107, GID: 108, Groups: []uint32{109, 110}}},
		{name: "the container's user over the pod's",
			pod:       &corev1.PodSecurityContext{RunAsUser: ptr.To[int64](107)},
			container: &corev1.SecurityContext{RunAsUser: ptr.To[int64](200), AllowPrivilegeEscalation: ptr.To(false)},
			want:      credentials{UID: 200, NoNewPrivs: true}},
		{name: "runAsNonRoot without a user is refused, as the kubelet does",
			pod: &corev1.PodSecurityContext{RunAsNonRoot: ptr.To(true)}, refused: true},
		{name: "the container may lift the pod's runAsNonRoot",
			pod: &corev1.PodSecurityContext{RunAsNonRoot: ptr.To(true)}, container: &corev1.SecurityContext{RunAsNonRoot: ptr.To(false)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pod := &corev1.Pod{Spec: corev1.PodSpec{SecurityContext: tt.pod}}
			pod.Name, pod.Namespace = "p", "ns"
			got, err := containerCredentials(pod, &corev1.Container{Name: "c", SecurityContext: tt.container})
			if tt.refused {
				if err == nil || !strings.Contains(err.Error(), "runAsNonRoot") {
					t.Errorf("containerCredentials() = %+v, %v; want a refusal naming runAsNonRoot", got, err)
				}
				return
			}
			if err != nil || got.UID != tt.want.UID || got.GID != tt.want.GID || got.NoNewPrivs != tt.want.NoNewPrivs || !slices.Equal(got.Groups, tt.want.Groups) {
				t.Errorf("containerCredentials() = %+v, %v; want %+v", got, err, tt.want)
			}
		})
	}
}

func TestUserRecordsAddOnlyWhatTheMachineLacks(t *testing.T) {
	dir := t.TempDir()
	// Root is on every machine: nothing to add.
	if mounts, err := userRecords(credentials{}, dir); err != nil || len(mounts) != 0 {
		t.Errorf("userRecords(root) = %v, %v; want nothing", mounts, err)
	}
	const unused = 4242421
	mounts, err := userRecords(credentials{UID: unused, GID: unused}, dir)
	if err != nil || len(mounts) != 2 {
		t.Fatalf("userRecords(%d) = %v, %v; want /etc/passwd and /etc/group", unused, mounts, err)
	}
	for _, m := range mounts {
		b, err := os.ReadFile(m.Source)
		if err != nil {
			t.Fatal(err)
		}
		machine, _ := os.ReadFile(m.Target)
		if !strings.HasPrefix(string(b), string(machine)) || !hasID(b, unused) || !m.ReadOnly || filepath.Dir(m.Source) != dir {
			t.Errorf("%s over %s: want the machine's records and one for %d, read-only, in %s:\n%s", m.Source, m.Target, unused, dir, b)
		}
	}
}
