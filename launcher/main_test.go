package launcher

import (
	"os"
	"testing"

	"github.com/lifeboat-vm/lifeboat/domain"
)

func TestMain(m *testing.M) {
	// The private daemons the tests start are this test binary, re-executed.
	domain.MaybeRunLibvirtdShim()
	os.Exit(m.Run())
}
