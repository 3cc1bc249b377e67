package vm

import (
	"fmt"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

// Command is what `kubectl lifeboat start|stop|restart` does to a VM.
type Command struct {
	// SetRunStrategy, when not empty, is the run strategy to patch into the VM.
	SetRunStrategy v1alpha1.RunStrategy
	// CreateInstance: create the VM's instance from its template (Manual VMs).
	CreateInstance bool
	// DeleteInstance: delete the VM's current instance.
	DeleteInstance bool
}

// StartCommand is what starting vm takes, given its instance (nil if none), as KubeVirt's virtctl does
// it: a Halted VM becomes Always; a Manual VM gets an instance; a running VM, or a Once VM that
// ran, is an error that says so.
func StartCommand(vm *v1alpha1.VirtualMachine, vmi *v1alpha1.VirtualMachineInstance) (Command, error) {
	running := vmi != nil && vmi.DeletionTimestamp == nil && !vmi.Status.Phase.Terminal()
	if running {
		return Command{}, fmt.Errorf("VM %s/%s is running already (instance phase %s)", vm.Namespace, vm.Name, vmi.Status.Phase)
	}
	switch runStrategy(vm) {
	case v1alpha1.RunStrategyHalted:
		return Command{SetRunStrategy: v1alpha1.RunStrategyAlways}, nil
	case v1alpha1.RunStrategyManual:
		if vmi != nil {
			// An ended instance is replaced: deleted first, created once it is gone.
			return Command{DeleteInstance: true, CreateInstance: true}, nil
		}
		return Command{CreateInstance: true}, nil
	case v1alpha1.RunStrategyOnce:
		if vmi != nil || vm.Status.InstanceName != "" {
			return Command{}, fmt.Errorf("VM %s/%s has run strategy Once and ran; set another run strategy to run it again", vm.Namespace, vm.Name)
		}
	}
	// Always, RerunOnFailure: the controller starts it; an ended RerunOnFailure instance is
	// cleared so that it does.
	if vmi != nil {
		return Command{DeleteInstance: true}, nil
	}
	return Command{}, fmt.Errorf("VM %s/%s is starting already (run strategy %s)", vm.Namespace, vm.Name, runStrategy(vm))
}

// StopCommand is what stopping vm takes: the strategies that start it again become Halted; a Manual
// VM's instance is deleted (its guest shuts down gracefully either way).
func StopCommand(vm *v1alpha1.VirtualMachine, vmi *v1alpha1.VirtualMachineInstance) (Command, error) {
	switch runStrategy(vm) {
	case v1alpha1.RunStrategyHalted:
		return Command{}, fmt.Errorf("VM %s/%s is halted already", vm.Namespace, vm.Name)
	case v1alpha1.RunStrategyManual:
		if vmi == nil || vmi.DeletionTimestamp != nil {
			return Command{}, fmt.Errorf("VM %s/%s is not running", vm.Namespace, vm.Name)
		}
		return Command{DeleteInstance: true}, nil
	}
	return Command{SetRunStrategy: v1alpha1.RunStrategyHalted}, nil
}

// RestartCommand is what restarting vm takes: its instance deleted, for the controller to make again;
// only the strategies that start an instance again can restart.
func RestartCommand(vm *v1alpha1.VirtualMachine, vmi *v1alpha1.VirtualMachineInstance) (Command, error) {
	switch s := runStrategy(vm); s {
	case v1alpha1.RunStrategyAlways, v1alpha1.RunStrategyRerunOnFailure:
		if vmi == nil {
			return Command{}, fmt.Errorf("VM %s/%s has no instance to restart; it is starting", vm.Namespace, vm.Name)
		}
		return Command{DeleteInstance: true}, nil
	default:
		return Command{}, fmt.Errorf("VM %s/%s has run strategy %s, which does not start it again: use stop, then start", vm.Namespace, vm.Name, s)
	}
}
