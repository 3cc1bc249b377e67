package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/lifeboat-vm/lifeboat/test/controlplane"
)

// rights prints what each of lifeboat's service accounts may do as installed from manifests/
// (kubectl auth can-i --list in lifeboat's namespace, as the account with its groups), on a
// control plane of its own that it stops afterwards. docs/security.md shows its output.
func rights(ctx context.Context) error {
	cp, err := controlplane.Start(ctx, controlplane.Options{Progress: os.Stderr, WithoutScheduler: true})
	if err != nil {
		return err
	}
	defer cp.Stop()
	root, err := controlplane.RepoRoot()
	if err != nil {
		return err
	}
	if out, err := cp.Kubectl(ctx, "apply", "--server-side", "-k", filepath.Join(root, "manifests")); err != nil {
		return fmt.Errorf("applying manifests/: %w\n%s", err, out)
	}
	for _, sa := range []string{"lifeboat-agent", "lifeboat-controller", "lifeboat-signer"} {
		out, err := cp.Kubectl(ctx, "auth", "can-i", "--list", "-n", controlplane.LifeboatNamespace,
			"--as=system:serviceaccount:"+controlplane.LifeboatNamespace+":"+sa, "--as-group=system:serviceaccounts",
			"--as-group=system:serviceaccounts:"+controlplane.LifeboatNamespace, "--as-group=system:authenticated")
		if err != nil {
			return fmt.Errorf("listing the rights of %s: %w\n%s", sa, err, out)
		}
		fmt.Printf("%s (kubectl auth can-i --list -n %s):\n\n%s\n", sa, controlplane.LifeboatNamespace, out)
	}
	return nil
}
