package agent

import (
	"context"
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/domain"
	"github.com/lifeboat-vm/lifeboat/test/kubewait"
)

// samplingLauncher is a launcher whose guest runs, counting the dirty-rate samples asked of it.
type samplingLauncher struct {
	healthyLauncher
	*stuckMigrator
	samples chan string
}

func (s *samplingLauncher) StartDirtyRateCalc(name string, period time.Duration, mode domain.DirtyRateMode) error {
	s.samples <- fmt.Sprintf("%s %s %s", name, period, mode)
	return nil
}

// TestTheAgentWarmsEachGuestsDirtyRateOnce: QEMU's first page-sampling estimate of a domain
// reads low, so the agent takes one, unread, when it first sees a launcher's guest run, and
// leaves a migration's own sample the first that counts. Not while the guest migrates (libvirt
// would hold the call until the migration's end), and once per launcher: a launcher runs one
// QEMU.
func TestTheAgentWarmsEachGuestsDirtyRateOnce(t *testing.T) {
	a := newFakeAgent(t, Config{})
	vmi := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "vm", UID: "uid-vm"}}
	vmi.Status.Phase, vmi.Status.NodeName = v1alpha1.VMIRunning, "node-a"
	vmi.Status.MigrationState = &v1alpha1.VirtualMachineInstanceMigrationState{MigrationName: "mig", SourceNode: "node-a", TargetNode: "node-b"}
	if err := a.informer.GetIndexer().Add(vmi); err != nil {
		t.Fatal(err)
	}
	conn := &samplingLauncher{healthyLauncher: healthyLauncher{changes: make(chan struct{})}, stuckMigrator: newStuckMigrator(), samples: make(chan string, 10)}
	a.mu.Lock()
	a.launchers[string(vmi.UID)] = &launcher{conn: conn}
	a.mu.Unlock()
	sync := func() {
		t.Helper()
		if _, err := a.sync(t.Context(), string(vmi.UID)); err != nil {
			t.Fatal(err)
		}
	}
	warmed := func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return a.launchers[string(vmi.UID)].warmed
	}

	sync()
	if warmed() {
		t.Error("the agent sampled a guest whose migration runs; want it left to the migration")
	}

	ended := vmi.DeepCopy()
	ended.Status.MigrationState.Failed = true
	if err := a.informer.GetIndexer().Update(ended); err != nil {
		t.Fatal(err)
	}
	sync()
	select {
	case got := <-conn.samples:
		if want := "ns_vm 1s page-sampling"; got != want {
			t.Errorf("sample %q, want %q", got, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no dirty-rate sample within 10 s of the agent seeing the guest run")
	}
	sync()
	sync()
	kubewait.Consistently(t, 300*time.Millisecond, "no second sample of the launcher's guest", func(context.Context) error {
		select {
		case got := <-conn.samples:
			return fmt.Errorf("sampled again: %s", got)
		default:
			return nil
		}
	})
}
