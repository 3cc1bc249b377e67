package node

import (
	"context"
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/component-helpers/apimachinery/lease"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// runLease keeps the node's Lease in kube-node-lease renewed with the kubelet's own lease
// controller; the node lifecycle controller takes the renewals as the node's heartbeat.
func (n *Node) runLease(ctx context.Context) {
	controller := lease.NewController(
		clock.RealClock{}, n.cfg.Client, n.cfg.Name, nodeLeaseDuration,
		func() { klog.FromContext(ctx).Info("Renewing the node lease keeps failing") },
		nodeLeaseRenewInterval, n.cfg.Name, corev1.NamespaceNodeLease,
		n.leaseOwner(ctx),
	)
	// A frozen node renews nothing; it starts again where it stopped once thawed.
	for ctx.Err() == nil {
		n.freezer.waitThawed(ctx)
		thawed, cancel := n.freezer.whileThawed(ctx)
		controller.Run(thawed)
		cancel()
	}
}

// leaseOwner makes the Node own its Lease, so that deleting the Node deletes the Lease
// (the kubelet's SetNodeOwnerFunc).
func (n *Node) leaseOwner(ctx context.Context) lease.ProcessLeaseFunc {
	return func(l *coordinationv1.Lease) error {
		if len(l.OwnerReferences) > 0 {
			return nil
		}
		node, err := n.cfg.Client.CoreV1().Nodes().Get(ctx, n.cfg.Name, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("reading node %s to own its lease: %w", n.cfg.Name, err)
		}
		l.OwnerReferences = []metav1.OwnerReference{{
			APIVersion: corev1.SchemeGroupVersion.Version,
			Kind:       "Node",
			Name:       node.Name,
			UID:        node.UID,
		}}
		return nil
	}
}

// runStatus keeps the Node's status what a healthy kubelet reports, and puts it back when the
// node lifecycle controller has changed it.
func (n *Node) runStatus(ctx context.Context) {
	lastReport := time.Now()
	wait.UntilWithContext(ctx, func(ctx context.Context) {
		n.freezer.waitThawed(ctx)
		reported, err := n.syncStatus(ctx, lastReport)
		if err != nil {
			klog.FromContext(ctx).Error(err, "Updating the node status")
			return
		}
		if reported {
			lastReport = time.Now()
		}
	}, nodeStatusUpdateFrequency)
}

func (n *Node) syncStatus(ctx context.Context, lastReport time.Time) (bool, error) {
	nodes := n.cfg.Client.CoreV1().Nodes()
	node, err := nodes.Get(ctx, n.cfg.Name, metav1.GetOptions{})
	if err != nil {
		return false, fmt.Errorf("reading node %s: %w", n.cfg.Name, err)
	}
	now := time.Now()
	desired := nodeStatus(n.cfg, node.Status, now)
	if !needsStatusUpdate(node.Status, desired, lastReport, now) {
		return false, nil
	}
	node = node.DeepCopy()
	node.Status = desired
	if _, err := nodes.UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		return false, fmt.Errorf("updating the status of node %s: %w", n.cfg.Name, err)
	}
	return true, nil
}
