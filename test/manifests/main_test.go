// Package manifests installs lifeboat from manifests/ into the local control plane, with
// server-side apply as an operator would, and checks what the API server makes of it: every
// object accepted, the components' RBAC enough for the calls their code makes and no more, and
// the controller's leader election working with the controller's own service account.
package manifests

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/lifeboat-vm/lifeboat/test/controlplane"
)

var (
	cluster *controlplane.ControlPlane
	// bins holds lifeboat-controller, built for this run.
	bins string
)

func TestMain(m *testing.M) {
	if err := buildController(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	controlplane.Main(cleanup{m}, &cluster, controlplane.Options{})
}

// cleanup removes the built binaries after the tests: controlplane.Main exits, so a defer in
// TestMain would never run.
type cleanup struct{ m *testing.M }

func (c cleanup) Run() int {
	defer os.RemoveAll(bins)
	return c.m.Run()
}

func buildController() error {
	var err error
	if bins, err = os.MkdirTemp("", "lifeboat-manifests-bin-*"); err != nil {
		return err
	}
	return controlplane.GoBuild{Out: filepath.Join(bins, "lifeboat-controller"), Packages: []string{"./cmd/lifeboat-controller"}, Output: os.Stderr}.Run(context.Background())
}
