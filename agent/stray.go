package agent

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

// A stray guest is one that runs in a launcher on this node while the API server says its VM
// runs elsewhere, or not at all: its node stopped answering (frozen, cut off), the cluster
// declared it gone (out-of-service taint, Node deleted) and restarted the VM on another node,
// and now the node is back with its QEMU still running. Two copies of one VM write one disk;
// the agent destroys the one here as soon as the API server, read live, says so, and never
// before: while it cannot reach the API server it stops nothing.

// Reasons a stray guest is destroyed (Events and the metric's label).
const (
	// StrayVMIGone: no VMI of the guest's name exists.
	StrayVMIGone = "VMIGone"
	// StrayVMIReplaced: the VMI of the guest's name is another instance (another UID).
	StrayVMIReplaced = "VMIReplaced"
	// StrayVMIEnded: the guest's VMI is Failed or Succeeded.
	StrayVMIEnded = "VMIEnded"
	// StrayVMIElsewhere: the guest's VMI runs on another node, and no migration brings it here.
	StrayVMIElsewhere = "VMIElsewhere"
	// ReasonStrayGuestDestroyed is the Event on the VMI whose stray guest was destroyed.
	ReasonStrayGuestDestroyed = "StrayGuestDestroyed"
)

// Stray is what the agent knows of a guest in a launcher on its node.
type Stray struct {
	// UID is the VMI UID the launcher serves (its directory's name); Node is this node.
	UID, Node string
	// Domain is the guest's state.
	Domain DomainState
	// VMI is the VMI of the guest's namespace and name as the API server has it now, read
	// live; nil when there is none.
	VMI *v1alpha1.VirtualMachineInstance
	// Migrating: a migration of the VMI from or to this node has not ended (read live).
	Migrating bool
}

// DecideStray says whether the guest must be destroyed so that it never runs beside another
// copy of its VM, why (a Stray* reason) and what to tell an admin. It is pure.
//
//	the guest            the VMI of its name (live)                       decision
//	not alive            anything                                         keep (nothing runs)
//	alive                a migration from or to this node runs             keep
//	alive                none                                             destroy (VMIGone)
//	alive                another UID                                      destroy (VMIReplaced)
//	alive                Failed or Succeeded                              destroy (VMIEnded)
//	alive                on another node, no migration brings it here     destroy (VMIElsewhere)
//	alive                on this node, or on none yet                     keep (it is this node's)
func DecideStray(s Stray) (destroy bool, reason, message string) {
	if !s.Domain.Alive() || s.Migrating {
		return false, "", ""
	}
	after := fmt.Sprintf("but its guest (VMI UID %s) still ran on node %s: destroyed, so that it never runs beside another copy of the VM", s.UID, s.Node)
	v := s.VMI
	switch {
	case v == nil:
		return true, StrayVMIGone, "the VMI no longer exists, " + after
	case string(v.UID) != s.UID:
		where := "not yet on a node"
		if v.Status.NodeName != "" {
			where = "on node " + v.Status.NodeName
		}
		return true, StrayVMIReplaced, fmt.Sprintf("VMI %s/%s is now another instance (UID %s, %s, %s), %s", v.Namespace, v.Name, v.UID, v.Status.Phase, where, after)
	case v.Status.Phase.Terminal():
		why := string(v.Status.Phase)
		if v.Status.Reason != "" {
			why += " (" + v.Status.Reason + ")"
		}
		return true, StrayVMIEnded, fmt.Sprintf("VMI %s/%s is %s, %s", v.Namespace, v.Name, why, after)
	case v.Status.NodeName != "" && v.Status.NodeName != s.Node:
		if m := v.Status.MigrationState; m != nil && m.TargetNode == s.Node {
			// This node was a migration's target: the migration's own clean-up ends the guest.
			return false, "", ""
		}
		return true, StrayVMIElsewhere, fmt.Sprintf("VMI %s/%s runs on node %s, %s", v.Namespace, v.Name, v.Status.NodeName, after)
	}
	return false, "", ""
}

// syncStray looks at the launcher of a VMI that this node's cache does not hold: its VMI was
// deleted, replaced, or moved to another node (or the cache is behind). For each running guest
// it reads the VMI and its migrations from the API server, live, and destroys the guest if
// DecideStray says so. An API server that does not answer is an error, retried: nothing is
// destroyed on what the agent last knew.
func (a *Agent) syncStray(ctx context.Context, uid string) (bool, error) {
	conn := a.conn(uid)
	if conn == nil {
		return false, nil
	}
	names, err := conn.DomainNames(ctx)
	if err != nil {
		return false, fmt.Errorf("listing the domains of launcher %s: %w", uid, err)
	}
	destroyed := false
	for _, name := range names {
		dom, err := conn.Observe(ctx, name)
		if err != nil {
			return destroyed, fmt.Errorf("observing domain %s: %w", name, err)
		}
		if dom == nil || !dom.State.Alive() {
			continue
		}
		// The domain's name is the launcher's to choose; its pod's namespace, recorded from what
		// lifeboat's controller wrote, is not: a name that contradicts it is not acted on.
		namespace, vmiName, ok := strings.Cut(name, "_")
		recorded, linked := a.recordedPod(uid)
		if !ok || (linked && recorded.Namespace != namespace) {
			a.cfg.Log.Warn("a launcher's domain is not named for its VMI (namespace_name, in its pod's namespace); leaving it", "vmiUID", uid, "domain", name)
			continue
		}
		s := Stray{UID: uid, Node: a.cfg.NodeName, Domain: dom.State}
		s.VMI, err = a.lifeboat.LifeboatV1alpha1().VirtualMachineInstances(namespace).Get(ctx, vmiName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			s.VMI, err = nil, nil
		}
		if err != nil {
			return destroyed, fmt.Errorf("reading VMI %s/%s, to learn whether the guest of launcher %s may run on (it runs on until the API server answers): %w", namespace, vmiName, uid, err)
		}
		if s.Migrating, err = a.migratingHere(ctx, namespace, uid); err != nil {
			return destroyed, err
		}
		destroy, reason, msg := DecideStray(s)
		if !destroy {
			continue
		}
		if err := conn.Destroy(ctx, name); err != nil {
			return destroyed, fmt.Errorf("destroying the stray guest %s of launcher %s: %w", name, uid, err)
		}
		destroyed = true
		a.reportStray(namespace, vmiName, uid, reason, msg, linked)
	}
	return destroyed, nil
}

// migratingHere reads, live, whether a migration of the VMI with uid from or to this node has
// not ended.
func (a *Agent) migratingHere(ctx context.Context, namespace, uid string) (bool, error) {
	list, err := a.lifeboat.LifeboatV1alpha1().VirtualMachineInstanceMigrations(namespace).List(ctx, metav1.ListOptions{
		LabelSelector: v1alpha1.LabelVMIUID + "=" + uid})
	if err != nil {
		return false, fmt.Errorf("listing the migrations of VMI UID %s: %w", uid, err)
	}
	for _, m := range list.Items {
		if !m.Status.Phase.Terminal() && (m.Status.SourceNode == a.cfg.NodeName || m.Status.TargetNode == a.cfg.NodeName) {
			return true, nil
		}
	}
	return false, nil
}

// reportStray records a destroyed stray guest: an Event, a log line and the metric. The Event
// is on its VMI (the instance it was, by UID) when the namespace and name are known to be the
// VMI's, its launcher pod's directory linked here (linked); else they are only what the
// launcher named its domain, and the Event is on this node's Node, so that no launcher puts one
// on another tenant's VMI. The decision itself holds whatever the name says: a guest is kept only
// while the VMI read by that name has the launcher's own UID (DecideStray).
func (a *Agent) reportStray(namespace, name, uid, reason, msg string, linked bool) {
	ref := a.nodeRef()
	if linked {
		ref = &corev1.ObjectReference{Kind: "VirtualMachineInstance", APIVersion: v1alpha1.SchemeGroupVersion.String(),
			Namespace: namespace, Name: name, UID: types.UID(uid)}
	} else {
		msg = fmt.Sprintf("the guest of the launcher of VMI UID %s, whose domain is named %s_%s: %s", uid, namespace, name, msg)
	}
	a.cfg.Recorder.Event(ref, corev1.EventTypeWarning, ReasonStrayGuestDestroyed, msg)
	a.cfg.Log.Warn(msg, "vmi", namespace+"/"+name, "vmiUID", uid, "reason", reason)
	a.cfg.Metrics.StrayGuestsDestroyed.WithLabelValues(reason).Inc()
}

// recordedPod is the launcher pod this node's directory of the VMI with uid was linked to, as
// recorded (it may be deleted since, while the agent holds its launcher's connection); false if
// none was, as after the agent restarted with the pod gone.
func (a *Agent) recordedPod(uid string) (RecordedPod, bool) {
	a.linksMu.Lock()
	defer a.linksMu.Unlock()
	if r, ok := a.links[uid]; ok {
		return r, true
	}
	r, ok := a.unlinked[uid]
	return r, ok
}
