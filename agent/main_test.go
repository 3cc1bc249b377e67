package agent

import (
	"os"
	"testing"

	"github.com/lifeboat-vm/lifeboat/agent/libvirtclient"
	"github.com/lifeboat-vm/lifeboat/domain"
)

func TestMain(m *testing.M) {
	// The private libvirt daemons some tests start, and the libvirt clients of LibvirtDialer, are
	// this test binary, re-executed.
	domain.MaybeRunLibvirtdShim()
	libvirtclient.MaybeRunChild()
	os.Exit(m.Run())
}
