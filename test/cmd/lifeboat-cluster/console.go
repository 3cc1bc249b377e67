package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifeboat-vm/lifeboat/test/guest"
)

// console prints the guest console of a demo VMI, first waiting for a line if asked to.
func console(ctx context.Context, dir, ref, waitFor string, timeout time.Duration) error {
	ns, name := splitRef(ref)
	_, lb, err := clients(dir)
	if err != nil {
		return err
	}
	vmi, err := lb.LifeboatV1alpha1().VirtualMachineInstances(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	if vmi.Status.NodeName == "" {
		return fmt.Errorf("VMI %s/%s runs on no node yet (phase %q)", ns, name, vmi.Status.Phase)
	}
	root, err := readNodesRoot(dir)
	if err != nil {
		return err
	}
	path := consolePath(root, vmi.Status.NodeName, string(vmi.UID))
	if waitFor != "" {
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		if _, err := guest.WaitForLine(ctx, path, waitFor); err != nil {
			return err
		}
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	fmt.Printf("--- guest console of %s/%s on %s (%s) ---\n%s", ns, name, vmi.Status.NodeName, path, b)
	return nil
}

// consolePath is where the launcher on a demo node logs a VMI's serial console; the emulated
// node keeps /var/run under <root>/run.
func consolePath(nodesRoot, node, vmiUID string) string {
	return filepath.Join(nodesRoot, node, "run", "lifeboat", "domains", vmiUID, "console.log")
}
