package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"

	lifeboatclient "github.com/lifeboat-vm/lifeboat/api/client/clientset/versioned"
	"github.com/lifeboat-vm/lifeboat/test/guest"
)

// console prints the guest console of a demo VMI, first waiting for a line if asked to.
func console(ctx context.Context, dir, ref, waitFor string, timeout time.Duration) error {
	ns, name, ok := strings.Cut(ref, "/")
	if !ok {
		ns, name = "default", ref
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(dir, "admin.kubeconfig"))
	if err != nil {
		return err
	}
	lb, err := lifeboatclient.NewForConfig(cfg)
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
	// The emulated node keeps /var/run under <root>/run.
	path := filepath.Join(nodesRoot, vmi.Status.NodeName, "run", "lifeboat", "domains", string(vmi.UID), "console.log")
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
