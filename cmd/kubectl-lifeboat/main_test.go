package main

import (
	"testing"

	"github.com/lifeboat-vm/lifeboat/test/controlplane"
)

// cluster is a real API server (with etcd and lifeboat's CRDs) that the commands run against.
var cluster *controlplane.ControlPlane

func TestMain(m *testing.M) {
	controlplane.Main(m, &cluster, controlplane.Options{WithoutControllerManager: true, WithoutScheduler: true})
}
