package bench

import (
	"context"
	"testing"

	"github.com/lifeboat-vm/lifeboat/test/controlplane"
)

// startControlPlane starts etcd and kube-apiserver alone, stopped when b ends, and returns a
// context that ends then too.
func startControlPlane(b *testing.B) (context.Context, *controlplane.ControlPlane) {
	b.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)
	cp, err := controlplane.Start(ctx, controlplane.Options{WithoutControllerManager: true, WithoutScheduler: true})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(cp.Stop)
	return ctx, cp
}
