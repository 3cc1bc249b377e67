package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/lifeboat-vm/lifeboat/agent"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/test/node"
)

// A hard eviction threshold gives the launcher pod one second, which no migration here can meet
// (slowMigrations: an idle 128 MiB guest otherwise moves within that second on loopback). The
// agent marks the VM at the SIGTERM (it cannot tell a hard threshold from a soft one by the signal)
// with the soft deadline, but records the VM lost as soon as its pod has ended, long before that
// deadline, and nothing chases it: no migration of it is left unfinished and none is made later.
func TestAHardEvictionIsRecordedLostAtOnce(t *testing.T) {
	setConfig(t, true, slowMigrations)
	startController(t)
	source := startNodes(t, 1, func(c *node.Config) { c.MemoryPressure.Hard = true })[0]
	ns := testNamespace(t)
	vmi := createVMI(t, ns, newVMI("hard", strategy(v1alpha1.EvictionStrategyLiveMigrate)))
	vmi = waitVMI(t, ns, vmi.Name, bootTimeout, "phase Running", running)
	waitCounterPast(t, source.consolePath(vmi), 0, bootTimeout)
	startNodes(t, 1) // somewhere it could have gone

	evicted := time.Now()
	if err := evict(t, source, vmi)(); err != nil {
		t.Fatal(err)
	}
	ended := time.Now()
	lost := waitVMI(t, ns, vmi.Name, 15*time.Second, "recorded lost (EvictionRequested False, EvacuationDeadlineExceeded)", func(v *v1alpha1.VirtualMachineInstance) bool {
		c := meta.FindStatusCondition(v.Status.Conditions, v1alpha1.VMIConditionEvictionRequested)
		return c != nil && c.Status == metav1.ConditionFalse && c.Reason == agent.ReasonEvacuationDeadlineExceeded
	})
	c := meta.FindStatusCondition(lost.Status.Conditions, v1alpha1.VMIConditionEvictionRequested)
	if lost.Status.Phase != v1alpha1.VMIFailed || lost.Status.EvacuationDeadline == nil {
		t.Fatalf("want a failed VMI that still shows the deadline it was marked with: %s", describe(lost))
	}
	// Condition times are whole seconds.
	if after := c.LastTransitionTime.Sub(ended); after > 3*time.Second {
		t.Errorf("lost recorded %s after the pod ended (at %s; the assumed deadline was %s), want at once: %s", after, c.LastTransitionTime, lost.Status.EvacuationDeadline, c.Message)
	}
	t.Logf("SIGTERM to lost on record: %s (the assumed deadline was %s after the eviction): %s",
		c.LastTransitionTime.Sub(evicted).Round(time.Second), lost.Status.EvacuationDeadline.Sub(evicted).Round(time.Second), c.Message)
	waitEvent(t, ns, vmi.Name, agent.ReasonEvacuationDeadlineExceeded, 10*time.Second)
	if got := source.metric(t, "lifeboat_agent_evacuations_lost_total"); got != 1 {
		t.Errorf("evacuations lost = %v, want 1", got)
	}

	// Any migration made in the second before the kill has failed; no other comes.
	err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		for _, m := range migrationsOf(t, lost) {
			if !strings.HasSuffix(m, ":Failed") {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("want every migration of the lost VM failed: %v", migrationsOf(t, lost))
	}
	made := migrationsOf(t, lost)
	if err := wait.PollUntilContextTimeout(context.Background(), time.Second, 10*time.Second, true, func(context.Context) (bool, error) {
		return len(migrationsOf(t, lost)) != len(made), nil
	}); err == nil {
		t.Errorf("a lost VM must not be chased: migrations %v, then %v", made, migrationsOf(t, lost))
	}
}
