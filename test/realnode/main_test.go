package realnode

import (
	"testing"

	"github.com/lifeboat-vm/lifeboat/test/controlplane"
)

var cluster *controlplane.ControlPlane

func TestMain(m *testing.M) { controlplane.Main(m, &cluster, controlplane.Options{}) }
