package node

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

func TestHostPath(t *testing.T) {
	l := layout{root: "/tmp/node-1", private: DefaultPrivateHostPaths}
	for _, tc := range []struct {
		name, path, want string
	}{
		{"a private prefix itself", "/var/run/lifeboat", "/tmp/node-1/run/lifeboat"},
		{"under a private prefix", "/var/run/lifeboat/domains/u1", "/tmp/node-1/run/lifeboat/domains/u1"},
		{"/run and /var/run meet", "/run/lifeboat/domains/u1", "/tmp/node-1/run/lifeboat/domains/u1"},
		{"the kubelet's directory", "/var/lib/kubelet/pods", "/tmp/node-1/var/lib/kubelet/pods"},
		{"a longer name is no prefix", "/var/lib/kubelet-other", "/var/lib/kubelet-other"},
		{"climbing out is not private", "/var/run/lifeboat/../other", "/run/other"},
		{"other paths are the machine's", "/var/lib/lifeboat/vmlinuz", "/var/lib/lifeboat/vmlinuz"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := l.hostPath(tc.path); got != tc.want {
				t.Errorf("hostPath(%q) = %q, want %q", tc.path, got, tc.want)
			}
		})
	}
}

func TestContainerMounts(t *testing.T) {
	l := layout{root: "/tmp/node-1", private: DefaultPrivateHostPaths}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{UID: "u1"},
		Spec: corev1.PodSpec{Volumes: []corev1.Volume{
			{Name: "domains", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/var/run/lifeboat/domains", Type: ptr.To(corev1.HostPathDirectoryOrCreate)}}},
			{Name: "kernels", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/var/lib/lifeboat"}}},
			{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
			{Name: "token", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{}}},
		}},
	}
	for _, tc := range []struct {
		name        string
		mounts      []corev1.VolumeMount
		want        []bindMount
		wantSkipped []string
	}{{
		name: "hostPath, private and not",
		mounts: []corev1.VolumeMount{
			{Name: "domains", MountPath: "/var/run/lifeboat/domains"},
			{Name: "kernels", MountPath: "/boot/guest/", ReadOnly: true},
		},
		want: []bindMount{
			{Source: "/var/lib/lifeboat", Target: "/boot/guest", ReadOnly: true},
			{Source: "/tmp/node-1/run/lifeboat/domains", Target: "/var/run/lifeboat/domains"},
		},
	}, {
		name: "emptyDir and subPath, parents before children",
		mounts: []corev1.VolumeMount{
			{Name: "scratch", MountPath: "/work/deep/cache", SubPath: "cache"},
			{Name: "scratch", MountPath: "/work"},
		},
		want: []bindMount{
			{Source: "/tmp/node-1/var/lib/kubelet/pods/u1/volumes/kubernetes.io~empty-dir/scratch", Target: "/work"},
			{Source: "/tmp/node-1/var/lib/kubelet/pods/u1/volumes/kubernetes.io~empty-dir/scratch/cache", Target: "/work/deep/cache"},
		},
	}, {
		name:        "other volume types are skipped",
		mounts:      []corev1.VolumeMount{{Name: "token", MountPath: "/var/run/secrets/kubernetes.io/serviceaccount"}},
		wantSkipped: []string{"token"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			got, skipped := containerMounts(l, pod, &corev1.Container{VolumeMounts: tc.mounts})
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("mounts (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantSkipped, skipped); diff != "" {
				t.Errorf("skipped (-want +got):\n%s", diff)
			}
		})
	}
}
