package node

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

func podWithGrace(terminationGracePeriod, deletionGracePeriod *int64) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{DeletionGracePeriodSeconds: deletionGracePeriod},
		Spec:       corev1.PodSpec{TerminationGracePeriodSeconds: terminationGracePeriod},
	}
}

func TestEffectiveGracePeriod(t *testing.T) {
	for _, tc := range []struct {
		name     string
		current  int64
		pod      *corev1.Pod
		override *int64
		want     int64
	}{
		{"the pod's own when nothing else says", 0, podWithGrace(ptr.To[int64](30), nil), nil, 30},
		{"the deletion's", 0, podWithGrace(ptr.To[int64](30), ptr.To[int64](5)), nil, 5},
		{"an eviction's shorter one", 0, podWithGrace(ptr.To[int64](30), ptr.To[int64](30)), ptr.To[int64](3), 3},
		{"an eviction's longer one does not apply", 0, podWithGrace(ptr.To[int64](30), ptr.To[int64](2)), ptr.To[int64](10), 2},
		{"never longer than the one in force", 3, podWithGrace(ptr.To[int64](30), ptr.To[int64](30)), nil, 3},
		{"shorter than the one in force", 10, podWithGrace(ptr.To[int64](30), ptr.To[int64](4)), nil, 4},
		{"force deletion still gets one second", 0, podWithGrace(ptr.To[int64](30), ptr.To[int64](0)), nil, 1},
		{"a zero override still gets one second", 0, podWithGrace(ptr.To[int64](30), nil), ptr.To[int64](0), 1},
		{"no grace period anywhere gets one second", 0, podWithGrace(nil, nil), nil, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := effectiveGracePeriod(tc.current, tc.pod, tc.override); got != tc.want {
				t.Errorf("effectiveGracePeriod = %d, want %d", got, tc.want)
			}
		})
	}
}

func TestEvictionGracePeriod(t *testing.T) {
	for _, tc := range []struct {
		name     string
		max      int64
		podGrace *int64
		hard     bool
		want     int64
	}{
		{"evictionMaxPodGracePeriod caps the pod's", 30, ptr.To[int64](60), false, 30},
		{"the pod's when shorter", 30, ptr.To[int64](10), false, 10},
		{"evictionMaxPodGracePeriod for a pod without one", 30, nil, false, 30},
		{"a zero evictionMaxPodGracePeriod grants none", 0, ptr.To[int64](30), false, 0},
		{"a hard threshold grants the minimum", 30, ptr.To[int64](60), true, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := evictionGracePeriod(tc.max, podWithGrace(tc.podGrace, nil), tc.hard); got != tc.want {
				t.Errorf("evictionGracePeriod = %d, want %d", got, tc.want)
			}
		})
	}
}

func TestRestartBackOff(t *testing.T) {
	for _, tc := range []struct {
		name     string
		restarts int32
		want     time.Duration
	}{
		{"first restart at once", 0, 0},
		{"second after 10s", 1, 10 * time.Second},
		{"then doubling", 2, 20 * time.Second},
		{"and doubling", 5, 160 * time.Second},
		{"up to 5 minutes", 6, 5 * time.Minute},
		{"and no more", 40, 5 * time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := restartBackOff(tc.restarts); got != tc.want {
				t.Errorf("restartBackOff(%d) = %s, want %s", tc.restarts, got, tc.want)
			}
		})
	}
}

func TestNextRestart(t *testing.T) {
	finished := time.Date(2026, 11, 22, 3, 0, 0, 0, time.UTC)
	exited := func(code, restarts int32) corev1.ContainerStatus {
		return corev1.ContainerStatus{RestartCount: restarts, State: corev1.ContainerState{
			Terminated: &corev1.ContainerStateTerminated{ExitCode: code, FinishedAt: metav1.NewTime(finished)},
		}}
	}
	backingOff := func(code, restarts int32) corev1.ContainerStatus {
		s := exited(code, restarts)
		s.LastTerminationState, s.State = s.State, corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reasonCrashLoopBackOff}}
		return s
	}
	for _, tc := range []struct {
		name        string
		policy      corev1.RestartPolicy
		status      corev1.ContainerStatus
		wantRestart bool
		wantAt      time.Time
	}{
		{"a container not created yet is started, not restarted", corev1.RestartPolicyAlways,
			corev1.ContainerStatus{State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reasonContainerCreating}}}, false, time.Time{}},
		{"a running container", corev1.RestartPolicyAlways,
			corev1.ContainerStatus{State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}, false, time.Time{}},
		{"Never", corev1.RestartPolicyNever, exited(1, 0), false, time.Time{}},
		{"OnFailure after a success", corev1.RestartPolicyOnFailure, exited(0, 0), false, time.Time{}},
		{"OnFailure after a failure, at once the first time", corev1.RestartPolicyOnFailure, exited(1, 0), true, finished},
		{"Always after a success", corev1.RestartPolicyAlways, exited(0, 0), true, finished},
		{"Always, backing off after two restarts", corev1.RestartPolicyAlways, backingOff(1, 2), true, finished.Add(20 * time.Second)},
		{"a configuration error is not retried", corev1.RestartPolicyAlways,
			corev1.ContainerStatus{State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reasonConfigError}}}, false, time.Time{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			restart, at := nextRestart(tc.policy, tc.status)
			if restart != tc.wantRestart || !at.Equal(tc.wantAt) {
				t.Errorf("nextRestart = %v, %s; want %v, %s", restart, at, tc.wantRestart, tc.wantAt)
			}
		})
	}
}
