package node

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/lifeboat-vm/lifeboat/test/controlplane"
)

var cluster *controlplane.ControlPlane

func TestMain(m *testing.M) {
	switch filepath.Base(os.Args[0]) {
	case netHelperCommand:
		os.Exit(netHelper(os.Args[1:]))
	case consoleHelperCommand:
		os.Exit(consoleHelper(os.Args[1:]))
	}
	// Containers are re-executions of this test binary: they must become shims before anything else.
	MaybeRunShim()
	controlplane.Main(m, &cluster, controlplane.Options{})
}
