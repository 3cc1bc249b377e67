// Package agent is lifeboat's node agent: it finds the launchers on its node, watches their
// domains, keeps their VMIs' status true and decides how each guest ends.
package agent

import (
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

// DomainState is the agent's view of a domain's life.
type DomainState string

const (
	DomainRunning DomainState = "Running"
	DomainPaused  DomainState = "Paused"
	// DomainPMSuspended: the guest suspended itself to RAM (ACPI S3); its memory is still there.
	DomainPMSuspended  DomainState = "PMSuspended"
	DomainShuttingDown DomainState = "ShuttingDown"
	DomainShutoff      DomainState = "Shutoff"
	DomainCrashed      DomainState = "Crashed"
)

// Alive reports whether the guest still exists in memory (seed 001's domainIsAlive, which
// counts paused and PM-suspended guests alive): a SIGTERM to its launcher must then be acted on.
func (s DomainState) Alive() bool {
	return s == DomainRunning || s == DomainPaused || s == DomainPMSuspended || s == DomainShuttingDown
}

// Domain is what the agent knows of a VMI's domain.
type Domain struct {
	State DomainState
	// GracefulShutdown is when the launcher received SIGTERM, as recorded in the domain's
	// metadata, so it survives an agent restart; nil if it has not.
	GracefulShutdown *time.Time
	// NotMigratableReason is empty when the guest can be live-migrated; NotMigratableMessage
	// says what stops it for a person.
	NotMigratableReason, NotMigratableMessage string
	// PodDeadline is when the launcher's pod grace period ends, as the launcher recorded it
	// with the signal (signal time + terminationGracePeriodSeconds).
	PodDeadline *time.Time
	// ShutdownSent is true once this agent pressed the guest's power button.
	ShutdownSent bool
	// Deletion is the launcher pod's deletion through the API, nil if it was not deleted: then a
	// SIGTERM came from the kubelet itself (node pressure).
	Deletion *PodDeletion
	// PausedUser: the domain is paused by a call (libvirt's reason User), as a migration made
	// with domain.MigrateOptions.PausedOnArrival leaves it on arrival.
	PausedUser bool
}

// reasonEvictionByEvictionAPI is the DisruptionTarget reason the API server gives a pod it
// deletes for an eviction (k8s.io/kubernetes pkg/registry/core/pod/storage/eviction.go; k8s.io/api
// has no constant for it).
const reasonEvictionByEvictionAPI = "EvictionByEvictionAPI"

// PodDeletion is what the API server says of a launcher pod's deletion.
type PodDeletion struct {
	// Deadline is the pod's deletionTimestamp: when its grace period ends and the kubelet kills it.
	Deadline time.Time
	// DisruptionReason is the reason of the pod's DisruptionTarget condition, "" without one.
	DisruptionReason string
}

// Cause is the migration cause of a deletion: an eviction through the API, or another deletion.
func (d *PodDeletion) Cause() v1alpha1.MigrationCause {
	if d.DisruptionReason == reasonEvictionByEvictionAPI {
		return v1alpha1.MigrationCauseAPIEviction
	}
	return v1alpha1.MigrationCausePodDeleted
}

// Eviction is what the agent knows of the cluster's and its kubelet's eviction settings.
type Eviction struct {
	// Config is the LifeboatConfig named cluster, nil if there is none.
	Config *v1alpha1.LifeboatConfig
	// MaxPodGracePeriod is the kubelet's evictionMaxPodGracePeriod in seconds, nil if unknown.
	MaxPodGracePeriod *int64
}

// Plan is what the agent does for one VMI after observing it.
type Plan struct {
	// Status, if not nil, is the VMI status to write.
	Status *v1alpha1.VirtualMachineInstanceStatus
	// Shutdown presses the guest's ACPI power button; Destroy pulls its plug.
	Shutdown, Destroy bool
	// RequeueAfter, if positive, asks to look again then (the destroy deadline).
	RequeueAfter time.Duration
	Events       []Event
	// SignalDecision is set when this plan is the first answer to a launcher's SIGTERM:
	// "evacuate" or "shutdown" (a metric label).
	SignalDecision string
	// Marked is true when this plan marks the VMI for evacuation; Lost when it records that the
	// VM stayed on the node past its evacuation deadline.
	Marked, Lost bool
	// StrayReason is set when Destroy ends a guest whose VMI ended (a Stray* reason).
	StrayReason string
	// Resume runs a guest that arrived here paused and that its source's hand-off did not run.
	Resume bool
}

// Decisions on a launcher's SIGTERM, as metric labels.
const (
	DecisionEvacuate = "evacuate"
	DecisionShutdown = "shutdown"
)

// Event is a Kubernetes Event for the VMI.
type Event struct{ Type, Reason, Message string }

// Event reasons and condition reasons the agent uses.
const (
	ReasonStarted         = "Started"
	ReasonShuttingDown    = "ShuttingDown"
	ReasonDestroyed       = "Destroyed"
	ReasonGuestCrashed    = "GuestCrashed"
	ReasonGuestRunning    = "GuestRunning"
	ReasonGuestNotRunning = v1alpha1.VMIReasonGuestNotRunning
	ReasonMigratable      = v1alpha1.VMIReasonMigratable
	// ReasonNodePressure is the EvictionRequested reason (and the migration cause) of a
	// kubelet's node-pressure eviction.
	ReasonNodePressure = "NodePressure"
	// ReasonEvacuationRequested is the Event of a new mark.
	ReasonEvacuationRequested = "EvacuationRequested"
	// ReasonResumedOnArrival is the Event of a guest the agent ran after its migration here.
	ReasonResumedOnArrival = "ResumedOnArrival"
	// ReasonEvacuationDeadlineExceeded says the VM was still on the node when the kubelet's
	// grace period ended: it was lost.
	ReasonEvacuationDeadlineExceeded = "EvacuationDeadlineExceeded"
)

// Reasons a VMI cannot be live-migrated (LiveMigratable=False).
const (
	// ReasonLocalDisk: boot.disk is a file on the node.
	ReasonLocalDisk = "LocalDisk"
	// ReasonDisksNotLiveMigratable: a claim only one node can mount (KubeVirt's reason).
	ReasonDisksNotLiveMigratable = "DisksNotLiveMigratable"
	// ReasonInterfaceNotLiveMigratable: a bridge binding on the pod network gives the guest
	// the pod's address, which the target pod does not have (KubeVirt's reason).
	ReasonInterfaceNotLiveMigratable = "InterfaceNotLiveMigratable"
)

// NotMigratable says why a VMI cannot be live-migrated, in words an admin acts on (what stops it
// and what would let it move), or "" if it can. A node file as disk (boot.disk) stays behind, and
// so does a claim only one node can mount; ReadWriteMany claims stay where they are, shared. What
// the target can make itself moves: kernels and containerDisk images from the same images, the
// cloud-init seed from the spec; what the guest wrote to its containerDisk overlays is copied
// during the migration (CopiesDisks). Every obstacle is named, the first one's reason given, so
// that fixing one does not reveal the next.
func NotMigratable(vmi *v1alpha1.VirtualMachineInstance) (reason, message string) {
	var why []string
	add := func(r, m string) {
		if reason == "" {
			reason = r
		}
		why = append(why, m)
	}
	if vmi.Spec.Boot.Disk != "" {
		add(ReasonLocalDisk, fmt.Sprintf("boot.disk %q is a file on the node, which a migration does not copy; "+
			"put the disk in a containerDisk image or on a ReadWriteMany persistentVolumeClaim to let the VM move", vmi.Spec.Boot.Disk))
	}
	if iface, ok, _ := v1alpha1.PodInterface(&vmi.Spec); ok && iface.Bridge != nil {
		add(ReasonInterfaceNotLiveMigratable, fmt.Sprintf("interface %q has the bridge binding on the pod network: the guest has the pod's address, and the target pod another; "+
			"use the masquerade binding (the guest keeps its address behind the pod's) to let the VM move", iface.Name))
	}
	for _, v := range vmi.Spec.Volumes {
		if v.PersistentVolumeClaim == nil {
			continue
		}
		claim := v.PersistentVolumeClaim.ClaimName
		switch recorded, rwx := v1alpha1.ReadWriteMany(vmi.Status.VolumeStatus, v.Name); {
		case !recorded:
			add(ReasonDisksNotLiveMigratable, fmt.Sprintf("persistentVolumeClaim %q (volume %q): its access modes are not recorded yet (the controller records them when it makes the VM's pod, once the claim is bound: kubectl get pvc %s)", claim, v.Name, claim))
		case !rwx:
			modes := "none"
			if info := v1alpha1.ClaimInfo(vmi.Status.VolumeStatus, v.Name); info != nil && len(info.AccessModes) > 0 {
				modes = fmt.Sprint(info.AccessModes)
			}
			add(ReasonDisksNotLiveMigratable, fmt.Sprintf("persistentVolumeClaim %q (volume %q) is not ReadWriteMany (its access modes: %s): the target node cannot mount it while the source does; "+
				"copy the disk to a ReadWriteMany claim (a storage class that offers it) to let the VM move", claim, v.Name, modes))
		}
	}
	return reason, strings.Join(why, "; and ")
}

// HasClaims reports whether the VMI has persistentVolumeClaim volumes.
func HasClaims(vmi *v1alpha1.VirtualMachineInstance) bool {
	return slices.ContainsFunc(vmi.Spec.Volumes, func(v v1alpha1.Volume) bool { return v.PersistentVolumeClaim != nil })
}

// CopiesDisks reports whether migrating the VMI copies disks: the overlays of its containerDisks.
func CopiesDisks(vmi *v1alpha1.VirtualMachineInstance) bool {
	return slices.ContainsFunc(vmi.Spec.Volumes, func(v v1alpha1.Volume) bool { return v.ContainerDisk != nil })
}

// lostCheckSlack is how long after an evacuation deadline the agent checks whether the VM was
// lost: the kubelet's kill and the end of the launcher's connection take a moment.
const lostCheckSlack = 2 * time.Second

// defaultGuestGrace is used when a VMI sets no grace period (KubeVirt's default).
const defaultGuestGrace = 30 * time.Second

// Decide is the agent's reconcile decision for one VMI on this node. vmi is never nil; dom is
// nil when the agent has no domain for it (not started yet, or gone).
func Decide(vmi *v1alpha1.VirtualMachineInstance, dom *Domain, ev Eviction, node string, now time.Time) Plan {
	var plan Plan
	status := vmi.Status.DeepCopy()
	nowMeta := metav1.NewTime(now)
	if evacuationLost(vmi, dom, node, now) {
		deadline := vmi.Status.EvacuationDeadline.UTC().Format(time.RFC3339)
		msg := fmt.Sprintf("the VM was still on node %s when its evacuation deadline %s passed; it was lost with its pod", node, deadline)
		if now.Before(vmi.Status.EvacuationDeadline.Add(-lostCheckSlack)) {
			// Killed long before the grace period the agent expected: a hard eviction threshold
			// (the kubelet then gives one second) or a force deletion. Nothing is left to move.
			msg = fmt.Sprintf("the launcher pod on node %s ended at %s, before the evacuation deadline %s (a hard eviction or a force deletion gives no grace: %s); the VM was lost with its pod",
				node, now.UTC().Format(time.RFC3339), deadline, vmi.Status.Message)
		}
		setCondition(status, v1alpha1.VMIConditionEvictionRequested, metav1.ConditionFalse, ReasonEvacuationDeadlineExceeded, msg, nowMeta)
		plan.Events = append(plan.Events, Event{corev1.EventTypeWarning, ReasonEvacuationDeadlineExceeded, msg})
		plan.Status, plan.Lost = status, true
		return plan
	}
	if dom != nil && vmi.Status.Phase.Terminal() && dom.State.Alive() && vmi.Status.NodeName == node {
		// The VMI ended (its node was declared lost, say, and the VM may start elsewhere)
		// while its guest runs on here: it must not run beside a new copy.
		_, _, msg := DecideStray(Stray{UID: string(vmi.UID), Node: node, Domain: dom.State, VMI: vmi})
		plan.Destroy = true
		plan.Events = append(plan.Events, Event{corev1.EventTypeWarning, ReasonStrayGuestDestroyed, msg})
		plan.StrayReason = StrayVMIEnded
		return plan
	}
	if dom == nil || vmi.Status.Phase.Terminal() {
		return plan
	}
	dom = withoutSourceSignal(vmi, dom, node)
	if dom.State == DomainPaused && dom.PausedUser && arrivedHere(vmi, node) {
		plan.Resume = true
		plan.Events = append(plan.Events, Event{corev1.EventTypeWarning, ReasonResumedOnArrival, fmt.Sprintf(
			"the guest arrived on node %s paused, and its source's hand-off did not run it (the link between the nodes broke as the source gave it up, or the source launcher was slower than this agent): node %s's agent runs it", node, node)})
	}

	switch {
	case dom.State == DomainCrashed:
		status.Phase = v1alpha1.VMIFailed
		status.Reason, status.Message = ReasonGuestCrashed, "the guest crashed"
		setCondition(status, v1alpha1.VMIConditionReady, metav1.ConditionFalse, ReasonGuestCrashed, status.Message, nowMeta)
		plan.Events = append(plan.Events, Event{corev1.EventTypeWarning, ReasonGuestCrashed, "the guest crashed on node " + node})
	case dom.State.Alive():
		if vmi.Status.Phase != v1alpha1.VMIRunning {
			plan.Events = append(plan.Events, Event{corev1.EventTypeNormal, ReasonStarted, "the guest runs on node " + node})
		}
		status.Phase = v1alpha1.VMIRunning
		status.NodeName = node
		setCondition(status, v1alpha1.VMIConditionReady, metav1.ConditionTrue, ReasonGuestRunning, "", nowMeta)
		if s := status.MigrationState; dom.State == DomainRunning && arrivedHere(vmi, node) && s.TargetNodeDomainReadyTimestamp == nil {
			// The launcher's own report usually records it first, while the migration runs; the
			// source may record the migration complete before that report is read, and then this
			// node's look at the guest does, so that every migration that arrived says when.
			s.TargetNodeDomainReadyTimestamp = &nowMeta
		}
		switch {
		case dom.NotMigratableReason == "" && noTargetNode(status):
			// The domain could move, but the evacuation controller found no node to take it: its
			// word stands until it finds one (it sets the condition back to True then).
		case dom.NotMigratableReason == "":
			setCondition(status, v1alpha1.VMIConditionLiveMigratable, metav1.ConditionTrue, ReasonMigratable, "", nowMeta)
		default:
			setCondition(status, v1alpha1.VMIConditionLiveMigratable, metav1.ConditionFalse, dom.NotMigratableReason,
				"the guest cannot be live-migrated: "+dom.NotMigratableMessage, nowMeta)
		}
		if ShouldEvacuateVMI(vmi, dom, ev.Config) {
			// Hold the shutdown: the evacuation controller moves the VM before the kubelet's deadline.
			plan.Marked = mark(status, vmi, dom, ev, node, nowMeta)
			// Look again just after the deadline: if the VM is still here then, it was lost.
			plan.RequeueAfter = status.EvacuationDeadline.Sub(now) + lostCheckSlack
			if plan.Marked {
				plan.SignalDecision = DecisionEvacuate
				c := meta.FindStatusCondition(status.Conditions, v1alpha1.VMIConditionEvictionRequested)
				plan.Events = append(plan.Events, Event{corev1.EventTypeNormal, ReasonEvacuationRequested, c.Message})
			}
		} else if start, why, ok := shutdownStart(vmi, dom); ok {
			deadline := start.Add(guestGrace(vmi))
			switch {
			case !now.Before(deadline):
				plan.Destroy = true
				plan.Events = append(plan.Events, Event{corev1.EventTypeWarning, ReasonDestroyed,
					fmt.Sprintf("the guest did not power off within its grace period (%s) and was destroyed", guestGrace(vmi))})
			case !dom.ShutdownSent:
				plan.Shutdown = true
				if vmi.DeletionTimestamp == nil {
					plan.SignalDecision = DecisionShutdown
				}
				plan.RequeueAfter = deadline.Sub(now)
				plan.Events = append(plan.Events, Event{corev1.EventTypeNormal, ReasonShuttingDown,
					fmt.Sprintf("%s: pressing the guest's power button; it is destroyed at %s", why, deadline.UTC().Format(time.RFC3339))})
			default:
				plan.RequeueAfter = deadline.Sub(now)
			}
		}
	default:
		setCondition(status, v1alpha1.VMIConditionReady, metav1.ConditionFalse, ReasonGuestNotRunning, "the guest is "+string(dom.State), nowMeta)
	}
	plan.Status = status
	return plan
}

// arrivedHere reports whether the VMI's last migration brought its guest to node and is
// recorded complete: its source gave the guest up, so the guest must run here.
func arrivedHere(vmi *v1alpha1.VirtualMachineInstance, node string) bool {
	s := vmi.Status.MigrationState
	return vmi.Status.NodeName == node && s != nil && s.Completed && s.TargetNode == node
}

// withoutSourceSignal drops a SIGTERM record that came with the guest from the node it migrated
// from: that signal was the source pod's, and this node's launcher never received it.
func withoutSourceSignal(vmi *v1alpha1.VirtualMachineInstance, dom *Domain, node string) *Domain {
	s := vmi.Status.MigrationState
	if dom.GracefulShutdown == nil || s == nil || !s.Completed || s.TargetNode != node || s.EndTimestamp == nil ||
		!dom.GracefulShutdown.Before(s.EndTimestamp.Time) {
		return dom
	}
	d := *dom
	d.GracefulShutdown, d.PodDeadline = nil, nil
	return &d
}

// mark sets the evacuation mark for a SIGTERM: the launcher pod's deletion through the API, with
// the deadline the API server set, or else the kubelet's own node-pressure eviction. It reports
// whether the mark is new.
func mark(status *v1alpha1.VirtualMachineInstanceStatus, vmi *v1alpha1.VirtualMachineInstance, dom *Domain, ev Eviction, node string, now metav1.Time) bool {
	if d := dom.Deletion; d != nil {
		why := "the launcher pod was deleted through the API"
		if d.DisruptionReason != "" {
			why += " (" + d.DisruptionReason + ")"
		}
		msg := fmt.Sprintf("%s; SIGTERM at %s, and the VM must leave node %s by the end of the pod's grace period, %s",
			why, dom.GracefulShutdown.UTC().Format(time.RFC3339), node, d.Deadline.UTC().Format(time.RFC3339))
		status.EvacuationDeadline = &metav1.Time{Time: d.Deadline}
		return v1alpha1.MarkForEvacuation(status, d.Cause(), msg, now)
	}
	podGrace := guestGrace(vmi)
	if dom.PodDeadline != nil {
		podGrace = dom.PodDeadline.Sub(*dom.GracefulShutdown)
	}
	deadline, assumed := EvictionDeadline(*dom.GracefulShutdown, podGrace, ev.MaxPodGracePeriod)
	msg := fmt.Sprintf("the kubelet is evicting the launcher pod (SIGTERM at %s); the VM must leave node %s by %s",
		dom.GracefulShutdown.UTC().Format(time.RFC3339), node, deadline.UTC().Format(time.RFC3339))
	if assumed {
		msg += fmt.Sprintf(" (the kubelet's evictionMaxPodGracePeriod is unknown to the agent: assuming the pod's grace period of %s)", podGrace)
	}
	status.EvacuationDeadline = &metav1.Time{Time: deadline}
	return v1alpha1.MarkForEvacuation(status, v1alpha1.MigrationCauseNodePressure, msg, now)
}

// evacuationLost reports whether a VM marked for evacuation from this node was still here,
// no longer alive, when its deadline passed or when its launcher pod ended (the VMI failed), and
// that has not been recorded yet.
func evacuationLost(vmi *v1alpha1.VirtualMachineInstance, dom *Domain, node string, now time.Time) bool {
	if vmi.Status.EvacuationNodeName != node || vmi.Status.NodeName != node || vmi.Status.EvacuationDeadline == nil {
		return false
	}
	// The kubelet counts its grace from before the launcher saw the signal, so it may kill a
	// moment before the recorded deadline; within the slack, a VM that is gone was lost. A VMI
	// that failed on this node (its pod ended; the VMI controller records that) is lost at once.
	ended := vmi.Status.Phase == v1alpha1.VMIFailed
	if (!ended && now.Before(vmi.Status.EvacuationDeadline.Add(-lostCheckSlack))) || (dom != nil && dom.State.Alive()) {
		return false
	}
	c := meta.FindStatusCondition(vmi.Status.Conditions, v1alpha1.VMIConditionEvictionRequested)
	return c == nil || c.Reason != ReasonEvacuationDeadlineExceeded
}

// shutdownStart says whether the guest must be shut down and from when its grace period runs:
// the user deleted the VMI, or the launcher was told to stop (SIGTERM).
func shutdownStart(vmi *v1alpha1.VirtualMachineInstance, dom *Domain) (time.Time, string, bool) {
	if vmi.DeletionTimestamp != nil {
		return vmi.DeletionTimestamp.Time, "the VMI is being deleted", true
	}
	if dom.GracefulShutdown != nil {
		return *dom.GracefulShutdown, "the launcher received SIGTERM", true
	}
	return time.Time{}, "", false
}

func guestGrace(vmi *v1alpha1.VirtualMachineInstance) time.Duration {
	if vmi.Spec.TerminationGracePeriodSeconds != nil {
		return time.Duration(*vmi.Spec.TerminationGracePeriodSeconds) * time.Second
	}
	return defaultGuestGrace
}

// setCondition keeps the transition time of a condition whose status did not change, so a
// status write happens only when something a reader cares about changed.
// noTargetNode: the LiveMigratable condition says that no node other than this one can take the VM.
func noTargetNode(status *v1alpha1.VirtualMachineInstanceStatus) bool {
	c := meta.FindStatusCondition(status.Conditions, v1alpha1.VMIConditionLiveMigratable)
	return c != nil && c.Status == metav1.ConditionFalse && c.Reason == v1alpha1.VMIReasonNoTargetNode
}

func setCondition(status *v1alpha1.VirtualMachineInstanceStatus, typ string, s metav1.ConditionStatus, reason, msg string, now metav1.Time) {
	meta.SetStatusCondition(&status.Conditions, metav1.Condition{Type: typ, Status: s, Reason: reason, Message: msg, LastTransitionTime: now})
}
