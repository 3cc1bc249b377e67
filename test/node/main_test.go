package node

import (
	"testing"

	"github.com/lifeboat-vm/lifeboat/test/controlplane"
)

var cluster *controlplane.ControlPlane

func TestMain(m *testing.M) {
	// Containers are re-executions of this test binary: they must become shims before anything else.
	MaybeRunShim()
	controlplane.Main(m, &cluster, controlplane.Options{})
}
