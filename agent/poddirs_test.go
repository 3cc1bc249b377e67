package agent

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

func TestLinkedPod(t *testing.T) {
	t0 := time.Date(2026, 11, 25, 10, 0, 0, 0, time.UTC)
	pod := func(uid string, created time.Duration, phase corev1.PodPhase) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{UID: types.UID(uid), CreationTimestamp: metav1.NewTime(t0.Add(created))},
			Status:     corev1.PodStatus{Phase: phase},
		}
	}
	tests := []struct {
		name string
		pods []*corev1.Pod
		want string // pod UID; "" for no link
	}{
		{"no pod: no link", nil, ""},
		{"one running pod", []*corev1.Pod{pod("a", 0, corev1.PodRunning)}, "a"},
		{"one pending pod (its volume may not exist yet)", []*corev1.Pod{pod("a", 0, corev1.PodPending)}, "a"},
		{"a pod that ended keeps its files until deleted", []*corev1.Pod{pod("a", 0, corev1.PodSucceeded)}, "a"},
		{"a new target pod after an old one that failed here",
			[]*corev1.Pod{pod("old", 0, corev1.PodFailed), pod("new", time.Minute, corev1.PodRunning)}, "new"},
		{"a running pod wins over a newer one that already ended",
			[]*corev1.Pod{pod("newer", time.Minute, corev1.PodFailed), pod("running", 0, corev1.PodRunning)}, "running"},
		{"of two that ended, the newer",
			[]*corev1.Pod{pod("new", time.Minute, corev1.PodFailed), pod("old", 0, corev1.PodSucceeded)}, "new"},
		{"of two that may run, the newer",
			[]*corev1.Pod{pod("old", 0, corev1.PodRunning), pod("new", time.Minute, corev1.PodPending)}, "new"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := LinkedPod(tt.pods)
			if gotUID := ""; ok != (tt.want != "") || ok && string(got.UID) != tt.want {
				if ok {
					gotUID = string(got.UID)
				}
				t.Errorf("LinkedPod() = %q (ok %v), want %q", gotUID, ok, tt.want)
			}
		})
	}
}
