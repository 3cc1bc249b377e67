package node

import (
	"context"
	"fmt"
	"maps"
	"runtime"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const (
	// nodeStatusUpdateFrequency and nodeStatusReportFrequency are the kubelet's defaults: how
	// often it computes the Node's status, and how often it writes one that has not changed.
	nodeStatusUpdateFrequency = 10 * time.Second
	nodeStatusReportFrequency = 5 * time.Minute
	// nodeLeaseRenewInterval and nodeLeaseDuration are the kubelet's node lease defaults.
	nodeLeaseRenewInterval = 10 * time.Second
	nodeLeaseDuration      = 40
)

var goarch = runtime.GOARCH

// newNodeObject is the Node the node registers: what the kubelet's initialNode and its status
// setters produce for this configuration at now.
func newNodeObject(cfg Config, now time.Time) *corev1.Node {
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: cfg.Name, Labels: maps.Clone(cfg.Labels)},
	}
	node.Status = nodeStatus(cfg, node.Status, now)
	return node
}

// nodeStatus is the status the node reports at now, given the one the API server has: the
// conditions of a healthy kubelet with fresh heartbeats, and transition times that move only
// when a condition's status changes.
func nodeStatus(cfg Config, old corev1.NodeStatus, now time.Time) corev1.NodeStatus {
	status := *old.DeepCopy()
	status.Capacity = cfg.Capacity.DeepCopy()
	status.Allocatable = cfg.Capacity.DeepCopy()
	status.Addresses = []corev1.NodeAddress{
		{Type: corev1.NodeInternalIP, Address: cfg.Address},
		{Type: corev1.NodeHostName, Address: cfg.Name},
	}
	status.DaemonEndpoints = corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: int32(cfg.KubeletPort)}}
	status.NodeInfo = corev1.NodeSystemInfo{
		KubeletVersion:          KubeletVersion,
		OperatingSystem:         "linux",
		Architecture:            goarch,
		ContainerRuntimeVersion: runtimeName + "://" + KubeletVersion,
	}
	heartbeat := metav1.NewTime(now).Rfc3339Copy()
	healthy := []corev1.NodeCondition{
		{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionFalse, Reason: "KubeletHasSufficientMemory", Message: "kubelet has sufficient memory available"},
		{Type: corev1.NodeDiskPressure, Status: corev1.ConditionFalse, Reason: "KubeletHasNoDiskPressure", Message: "kubelet has no disk pressure"},
		{Type: corev1.NodePIDPressure, Status: corev1.ConditionFalse, Reason: "KubeletHasSufficientPID", Message: "kubelet has sufficient PID available"},
		{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", Message: "kubelet is posting ready status"},
	}
	status.Conditions = nil
	for _, c := range healthy {
		c.LastHeartbeatTime, c.LastTransitionTime = heartbeat, heartbeat
		for _, o := range old.Conditions {
			if o.Type == c.Type && o.Status == c.Status {
				c.LastTransitionTime = o.LastTransitionTime
			}
		}
		status.Conditions = append(status.Conditions, c)
	}
	return status
}

// needsStatusUpdate says whether the kubelet would write desired over current: when anything
// but the heartbeat times changed (the node lifecycle controller marking the node NotReady,
// say), or when the last write is nodeStatusReportFrequency old.
func needsStatusUpdate(current, desired corev1.NodeStatus, lastReport, now time.Time) bool {
	if now.Sub(lastReport) >= nodeStatusReportFrequency {
		return true
	}
	return !equality.Semantic.DeepEqual(withoutHeartbeats(current), withoutHeartbeats(desired))
}

func withoutHeartbeats(status corev1.NodeStatus) corev1.NodeStatus {
	status = *status.DeepCopy()
	for i := range status.Conditions {
		status.Conditions[i].LastHeartbeatTime = metav1.Time{}
	}
	return status
}

// register creates the Node, or takes over an existing one of the same name as a restarted
// kubelet does: its labels are merged in and its status replaced.
func (n *Node) register(ctx context.Context) error {
	nodes := n.cfg.Client.CoreV1().Nodes()
	desired := newNodeObject(n.cfg, time.Now())
	_, err := nodes.Create(ctx, desired, metav1.CreateOptions{})
	switch {
	case err == nil:
		return nil
	case !apierrors.IsAlreadyExists(err):
		return fmt.Errorf("registering node %s: %w", n.cfg.Name, err)
	}
	existing, err := nodes.Get(ctx, n.cfg.Name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("reading the existing node %s: %w", n.cfg.Name, err)
	}
	existing = existing.DeepCopy()
	if existing.Labels == nil {
		existing.Labels = map[string]string{}
	}
	maps.Copy(existing.Labels, desired.Labels)
	if existing, err = nodes.Update(ctx, existing, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("updating the labels of node %s: %w", n.cfg.Name, err)
	}
	existing.Status = nodeStatus(n.cfg, existing.Status, time.Now())
	if _, err := nodes.UpdateStatus(ctx, existing, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("updating the status of node %s: %w", n.cfg.Name, err)
	}
	return nil
}
