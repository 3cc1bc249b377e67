package agent

import (
	"os"
	"testing"

	"github.com/lifeboat-vm/lifeboat/domain"
)

func TestMain(m *testing.M) {
	// The private libvirt daemons some tests start are this test binary, re-executed.
	domain.MaybeRunLibvirtdShim()
	os.Exit(m.Run())
}
