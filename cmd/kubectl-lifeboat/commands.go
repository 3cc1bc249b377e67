package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	lifeboatclient "github.com/lifeboat-vm/lifeboat/api/client/clientset/versioned"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/evacuation/vm"
)

type client struct {
	lb        lifeboatclient.Interface
	kube      kubernetes.Interface
	namespace string
	out       io.Writer
}

// get reads the VM and its instance (nil if none), with errors that name the VM.
func (c *client) get(ctx context.Context, name string) (*v1alpha1.VirtualMachine, *v1alpha1.VirtualMachineInstance, error) {
	v, err := c.lb.LifeboatV1alpha1().VirtualMachines(c.namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, nil, fmt.Errorf("VM %s/%s not found (kubectl get vm -n %s lists the namespace's VMs)", c.namespace, name, c.namespace)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("reading VM %s/%s: %w", c.namespace, name, err)
	}
	i, err := c.lb.LifeboatV1alpha1().VirtualMachineInstances(c.namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return v, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("reading the instance of VM %s/%s: %w", c.namespace, name, err)
	}
	if !metav1.IsControlledBy(i, v) {
		return v, nil, fmt.Errorf("VMI %s/%s is not VM %s's instance: delete it, or name the VM otherwise", c.namespace, name, name)
	}
	return v, i, nil
}

// apply carries out what a start, stop or restart takes.
func (c *client) apply(ctx context.Context, v *v1alpha1.VirtualMachine, i *v1alpha1.VirtualMachineInstance, cmd vm.Command, done string) error {
	if cmd.SetRunStrategy != "" {
		patch, _ := json.Marshal(map[string]any{"spec": map[string]any{"runStrategy": cmd.SetRunStrategy}})
		if _, err := c.lb.LifeboatV1alpha1().VirtualMachines(v.Namespace).Patch(ctx, v.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			return fmt.Errorf("setting the run strategy of VM %s/%s to %s: %w", v.Namespace, v.Name, cmd.SetRunStrategy, err)
		}
	}
	if cmd.DeleteInstance && i != nil {
		err := c.lb.LifeboatV1alpha1().VirtualMachineInstances(i.Namespace).Delete(ctx, i.Name, metav1.DeleteOptions{Preconditions: metav1.NewUIDPreconditions(string(i.UID))})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("deleting the instance of VM %s/%s: %w", v.Namespace, v.Name, err)
		}
	}
	if cmd.CreateInstance {
		if cmd.DeleteInstance && i != nil {
			// The ended instance's finalizer holds it until its pod is gone.
			err := wait.PollUntilContextCancel(ctx, 250*time.Millisecond, true, func(ctx context.Context) (bool, error) {
				_, err := c.lb.LifeboatV1alpha1().VirtualMachineInstances(i.Namespace).Get(ctx, i.Name, metav1.GetOptions{})
				return apierrors.IsNotFound(err), nil
			})
			if err != nil {
				return fmt.Errorf("waiting for the ended instance of VM %s/%s to go: %w", v.Namespace, v.Name, err)
			}
		}
		if _, err := c.lb.LifeboatV1alpha1().VirtualMachineInstances(v.Namespace).Create(ctx, vm.NewInstance(v), metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("creating the instance of VM %s/%s: %w", v.Namespace, v.Name, err)
		}
	}
	fmt.Fprintf(c.out, "VM %s/%s %s\n", v.Namespace, v.Name, done)
	return nil
}

func (c *client) start(ctx context.Context, name string) error {
	v, i, err := c.get(ctx, name)
	if err != nil {
		return err
	}
	cmd, err := vm.StartCommand(v, i)
	if err != nil {
		return err
	}
	return c.apply(ctx, v, i, cmd, "was scheduled to start")
}

func (c *client) stop(ctx context.Context, name string) error {
	v, i, err := c.get(ctx, name)
	if err != nil {
		return err
	}
	cmd, err := vm.StopCommand(v, i)
	if err != nil {
		return err
	}
	return c.apply(ctx, v, i, cmd, "was scheduled to stop")
}

func (c *client) restart(ctx context.Context, name string) error {
	v, i, err := c.get(ctx, name)
	if err != nil {
		return err
	}
	cmd, err := vm.RestartCommand(v, i)
	if err != nil {
		return err
	}
	return c.apply(ctx, v, i, cmd, "was scheduled to restart")
}

// migrate creates a migration of the VM's instance, without a cause annotation so its cause is
// Manual, and returns its name; hint adds how to follow it.
func (c *client) migrate(ctx context.Context, name string, hint bool) (string, error) {
	v, i, err := c.get(ctx, name)
	if err != nil {
		return "", err
	}
	if i == nil || i.Status.Phase != v1alpha1.VMIRunning {
		return "", fmt.Errorf("VM %s/%s is not running: there is nothing to migrate", v.Namespace, v.Name)
	}
	m, err := c.lb.LifeboatV1alpha1().VirtualMachineInstanceMigrations(v.Namespace).Create(ctx, &v1alpha1.VirtualMachineInstanceMigration{
		ObjectMeta: metav1.ObjectMeta{GenerateName: v.Name + "-migration-"},
		Spec:       v1alpha1.VirtualMachineInstanceMigrationSpec{VMIName: i.Name},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("creating a migration of VM %s/%s: %w", v.Namespace, v.Name, err)
	}
	follow := ""
	if hint {
		follow = fmt.Sprintf(" (kubectl lifeboat follow %s -n %s follows it)", v.Name, v.Namespace)
	}
	fmt.Fprintf(c.out, "VM %s/%s is migrating from node %s: migration %s%s\n", v.Namespace, v.Name, i.Status.NodeName, m.Name, follow)
	return m.Name, nil
}

func (c *client) cancelEvacuation(ctx context.Context, name string) error {
	v, i, err := c.get(ctx, name)
	if err != nil {
		return err
	}
	if i == nil || i.Status.EvacuationNodeName == "" {
		return fmt.Errorf("VM %s/%s is not being evacuated", v.Namespace, v.Name)
	}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{v1alpha1.AnnotationCancelEvacuation: "true"}}})
	if _, err := c.lb.LifeboatV1alpha1().VirtualMachineInstances(i.Namespace).Patch(ctx, i.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("cancelling the evacuation of VM %s/%s: %w", v.Namespace, v.Name, err)
	}
	fmt.Fprintf(c.out, "VM %s/%s: evacuation from node %s cancelled\n", v.Namespace, v.Name, i.Status.EvacuationNodeName)
	return nil
}
