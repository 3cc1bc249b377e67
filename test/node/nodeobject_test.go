package node

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestNodeStatus(t *testing.T) {
	now := time.Date(2026, 11, 22, 3, 0, 0, 0, time.UTC)
	earlier := metav1.NewTime(now.Add(-time.Hour))
	cfg, err := Config{Name: "node-1", Address: "127.0.0.11"}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	old := corev1.NodeStatus{Conditions: []corev1.NodeCondition{
		{Type: corev1.NodeReady, Status: corev1.ConditionUnknown, LastHeartbeatTime: earlier, LastTransitionTime: earlier},
		{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionFalse, LastHeartbeatTime: earlier, LastTransitionTime: earlier},
	}}
	status := nodeStatus(cfg, old, now)
	conditions := map[corev1.NodeConditionType]corev1.NodeCondition{}
	for _, c := range status.Conditions {
		conditions[c.Type] = c
	}
	for _, tc := range []struct {
		name           string
		typ            corev1.NodeConditionType
		wantStatus     corev1.ConditionStatus
		wantTransition metav1.Time
	}{
		{"Ready again after the controller's Unknown", corev1.NodeReady, corev1.ConditionTrue, metav1.NewTime(now)},
		{"an unchanged condition keeps its transition time", corev1.NodeMemoryPressure, corev1.ConditionFalse, earlier},
		{"a new condition starts now", corev1.NodePIDPressure, corev1.ConditionFalse, metav1.NewTime(now)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := conditions[tc.typ]
			if c.Status != tc.wantStatus || !c.LastTransitionTime.Equal(&tc.wantTransition) || !c.LastHeartbeatTime.Time.Equal(now) {
				t.Errorf("%s = %s since %s, heartbeat %s; want %s since %s, heartbeat now",
					tc.typ, c.Status, c.LastTransitionTime, c.LastHeartbeatTime, tc.wantStatus, tc.wantTransition)
			}
		})
	}
	if got := status.Allocatable.Memory().String(); got != "8Gi" {
		t.Errorf("allocatable memory = %s, want the default 8Gi", got)
	}
	if status.NodeInfo.KubeletVersion != KubeletVersion {
		t.Errorf("kubelet version = %q, want %q", status.NodeInfo.KubeletVersion, KubeletVersion)
	}
}

func TestNeedsStatusUpdate(t *testing.T) {
	now := time.Date(2026, 11, 22, 3, 0, 0, 0, time.UTC)
	cfg, err := Config{Name: "node-1", Address: "127.0.0.11"}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	current := nodeStatus(cfg, corev1.NodeStatus{}, now.Add(-time.Minute))
	notReady := *current.DeepCopy()
	for i := range notReady.Conditions {
		if notReady.Conditions[i].Type == corev1.NodeReady {
			notReady.Conditions[i].Status = corev1.ConditionUnknown
		}
	}
	for _, tc := range []struct {
		name       string
		current    corev1.NodeStatus
		lastReport time.Time
		want       bool
	}{
		{"only the heartbeats would move", current, now.Add(-time.Minute), false},
		{"the node lifecycle controller marked it Unknown", notReady, now.Add(-time.Minute), true},
		{"unchanged for the report period", current, now.Add(-nodeStatusReportFrequency), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			desired := nodeStatus(cfg, tc.current, now)
			if got := needsStatusUpdate(tc.current, desired, tc.lastReport, now); got != tc.want {
				t.Errorf("needsStatusUpdate = %v, want %v", got, tc.want)
			}
		})
	}
}
