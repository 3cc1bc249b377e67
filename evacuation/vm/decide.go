// Package vm is the VirtualMachine controller: by a VM's run strategy it creates the VM's
// instance (a VirtualMachineInstance of the VM's name, owned by it), makes it again once it
// ended, or stops it. Naming the instance after the VM is what keeps a VM to one instance at a
// time, also across controller restarts and leader changes: the API server refuses a second
// object of the same name.
package vm

import (
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

// Action is what the controller does for a VM now.
type Action string

const (
	// Nothing: the VM is as its strategy wants it.
	Nothing Action = ""
	// Create the VM's instance.
	Create Action = "Create"
	// Restart: delete the ended instance, to create it again once it is gone.
	Restart Action = "Restart"
	// Stop: delete the running instance; its guest shuts down gracefully first.
	Stop Action = "Stop"
	// Clean up an ended instance that the strategy does not run again, so that the VM reads
	// Stopped; none of the guest's state is lost (it ended).
	Clean Action = "Clean"
)

// Decide is what the run strategy asks for, given the VM's instance (nil if it has none) and
// whether it ever had one (status.instanceName was set).
//
//	strategy        no instance yet           instance ended Succeeded   ended Failed   running
//	Always          Create                    Restart                    Restart        Nothing
//	RerunOnFailure  Create                    Nothing (stopped)          Restart        Nothing
//	Once            Create, unless it ran     Nothing                    Nothing        Nothing
//	Manual          Nothing                   Nothing                    Nothing        Nothing
//	Halted          Nothing                   Clean                      Clean          Stop
//
// An instance being deleted is waited for: Nothing until it is gone.
func Decide(vm *v1alpha1.VirtualMachine, vmi *v1alpha1.VirtualMachineInstance) Action {
	strategy := runStrategy(vm)
	if vmi != nil && vmi.DeletionTimestamp != nil {
		return Nothing
	}
	if vmi == nil {
		switch strategy {
		case v1alpha1.RunStrategyAlways, v1alpha1.RunStrategyRerunOnFailure:
			return Create
		case v1alpha1.RunStrategyOnce:
			if vm.Status.InstanceName == "" {
				return Create
			}
		}
		return Nothing
	}
	ended := vmi.Status.Phase.Terminal()
	switch strategy {
	case v1alpha1.RunStrategyAlways:
		if ended {
			return Restart
		}
	case v1alpha1.RunStrategyRerunOnFailure:
		if vmi.Status.Phase == v1alpha1.VMIFailed {
			return Restart
		}
	case v1alpha1.RunStrategyHalted:
		if ended {
			return Clean
		}
		return Stop
	}
	return Nothing
}

// Status is the VM's status for its instance (nil if none), whose launcher pod the scheduler may
// have found no node for (unschedulable): the printable status, readiness and the Ready
// condition, the instance's name, and the restart count carried over.
func Status(vm *v1alpha1.VirtualMachine, vmi *v1alpha1.VirtualMachineInstance, unschedulable bool, now metav1.Time) v1alpha1.VirtualMachineStatus {
	status := *vm.Status.DeepCopy()
	status.ObservedGeneration = vm.Generation
	status.Ready = false
	status.InstanceName = ""
	if vmi != nil {
		status.InstanceName = vmi.Name
	}
	status.PrintableStatus = printable(vm, vmi, unschedulable)
	reason, msg := string(status.PrintableStatus), "the VM is "+string(status.PrintableStatus)
	if status.PrintableStatus == v1alpha1.PrintableStatusWaitingForNode {
		// Why it waits, and what an admin does, as the instance says it.
		msg = "the VM waits for its node: " + meta.FindStatusCondition(vmi.Status.Conditions, v1alpha1.VMIConditionNodeLost).Message
	}
	cond := metav1.ConditionFalse
	if vmi != nil && status.PrintableStatus == v1alpha1.PrintableStatusRunning {
		if c := meta.FindStatusCondition(vmi.Status.Conditions, v1alpha1.VMIConditionReady); c != nil && c.Status == metav1.ConditionTrue {
			status.Ready, cond, reason, msg = true, metav1.ConditionTrue, "InstanceReady", "the VM's instance "+vmi.Name+" is Ready"
		}
	}
	meta.SetStatusCondition(&status.Conditions, metav1.Condition{Type: v1alpha1.VMIConditionReady, Status: cond, Reason: reason, Message: msg, LastTransitionTime: now, ObservedGeneration: vm.Generation})
	return status
}

func printable(vm *v1alpha1.VirtualMachine, vmi *v1alpha1.VirtualMachineInstance, unschedulable bool) v1alpha1.PrintableStatus {
	switch {
	case vmi == nil:
		if Decide(vm, nil) == Create {
			return v1alpha1.PrintableStatusStarting
		}
		return v1alpha1.PrintableStatusStopped
	case meta.IsStatusConditionTrue(vmi.Status.Conditions, v1alpha1.VMIConditionNodeLost):
		// Also while it is being stopped: its guest may still run on the lost node.
		return v1alpha1.PrintableStatusWaitingForNode
	case vmi.DeletionTimestamp != nil:
		return v1alpha1.PrintableStatusStopping
	case vmi.Status.Phase == v1alpha1.VMIFailed:
		return v1alpha1.PrintableStatusFailed
	case vmi.Status.Phase == v1alpha1.VMISucceeded:
		return v1alpha1.PrintableStatusStopped
	case vmi.Status.Phase == v1alpha1.VMIRunning:
		if s := vmi.Status.MigrationState; s != nil && !s.Completed && !s.Failed && s.StartTimestamp != nil {
			return v1alpha1.PrintableStatusMigrating
		}
		return v1alpha1.PrintableStatusRunning
	case unschedulable && (vmi.Status.Phase == v1alpha1.VMIScheduling || vmi.Status.Phase == v1alpha1.VMIPending):
		return v1alpha1.PrintableStatusErrorUnschedulable
	}
	return v1alpha1.PrintableStatusStarting
}
