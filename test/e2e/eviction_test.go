package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/lifeboat-vm/lifeboat/api/launcher"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/test/guest"
	"github.com/lifeboat-vm/lifeboat/test/guest/protocol"
	"github.com/lifeboat-vm/lifeboat/test/kubewait"
)

// setConfig makes the cluster's LifeboatConfig turn node-pressure evacuation on or off.
func setConfig(t testing.TB, gateOn bool, mutate ...func(*v1alpha1.LifeboatConfig)) {
	t.Helper()
	ctx := context.Background()
	configs := cluster.Lifeboat.LifeboatV1alpha1().LifeboatConfigs()
	cfg := &v1alpha1.LifeboatConfig{ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.ConfigName}}
	cfg.Spec.AllowedNodeDirectories = guestDirectories()
	if gateOn {
		cfg.Spec.FeatureGates = []v1alpha1.FeatureGate{v1alpha1.FeatureGateNodePressureEvictionLiveMigration}
	}
	for _, m := range mutate {
		m(cfg)
	}
	_ = configs.Delete(ctx, v1alpha1.ConfigName, metav1.DeleteOptions{})
	if _, err := configs.Create(ctx, cfg, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating the LifeboatConfig: %v", err)
	}
	t.Cleanup(func() { _ = configs.Delete(context.Background(), v1alpha1.ConfigName, metav1.DeleteOptions{}) })
}

func strategy(s v1alpha1.EvictionStrategy) func(*v1alpha1.VirtualMachineInstance) {
	return func(v *v1alpha1.VirtualMachineInstance) { v.Spec.EvictionStrategy = ptr.To(s) }
}

// runningVM starts the controller, one node with its agent, and a VM on it; it returns when the
// guest counts. A phantom node (phantomNode) is somewhere the VM could go that nothing reaches:
// its evacuations get migrations that wait for a node, as the tests on one node expect; without
// it the VM could go nowhere (NoTargetNode) and would get none.
func runningVM(t *testing.T, name string, mutate ...func(*v1alpha1.VirtualMachineInstance)) (*testNode, *v1alpha1.VirtualMachineInstance) {
	t.Helper()
	startController(t)
	n := startNodes(t, 1)[0]
	phantomNode(t, nil)
	ns := testNamespace(t)
	vmi := createVMI(t, ns, newVMI(name, mutate...))
	vmi = waitVMI(t, ns, vmi.Name, bootTimeout, "phase Running", running)
	waitCounterPast(t, n.consolePath(vmi), 0, bootTimeout)
	return n, vmi
}

// evict has the emulated kubelet evict the VM's launcher pod for memory pressure; the returned
// function waits until the pod is terminal.
func evict(t testing.TB, n *testNode, vmi *v1alpha1.VirtualMachineInstance) (wait func() error) {
	t.Helper()
	pod := launcherPod(t, vmi)
	done := make(chan error, 1)
	go func() { done <- n.EvictPod(context.Background(), pod.Namespace, pod.Name) }()
	wait = sync.OnceValue(func() error {
		select {
		case err := <-done:
			return err
		case <-time.After(time.Duration(evictionMaxPodGracePeriod+30) * time.Second):
			return fmt.Errorf("the eviction of %s never ended", pod.Name)
		}
	})
	t.Cleanup(func() {
		if err := wait(); err != nil {
			t.Error(err)
		}
	})
	return wait
}

func marked(v *v1alpha1.VirtualMachineInstance) bool {
	return v.Status.EvacuationNodeName != "" && v.Status.EvacuationNodeName == v.Status.NodeName
}

// expectShutdown: the guest is powered off through ACPI and the VMI ends, never marked.
func expectShutdown(t *testing.T, n *testNode, vmi *v1alpha1.VirtualMachineInstance) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := guest.WaitForLine(ctx, n.consolePath(vmi), protocol.PowerButton); err != nil {
		t.Fatalf("want a graceful shutdown: %v", err)
	}
	v := waitVMI(t, vmi.Namespace, vmi.Name, time.Minute, "a final phase", func(v *v1alpha1.VirtualMachineInstance) bool {
		return v.Status.Phase == v1alpha1.VMISucceeded || v.Status.Phase == v1alpha1.VMIFailed
	})
	// A mark leaves EvictionRequested behind even once cleared: its absence says there never was one.
	if c := meta.FindStatusCondition(v.Status.Conditions, v1alpha1.VMIConditionEvictionRequested); v.Status.EvacuationNodeName != "" || c != nil {
		t.Errorf("a VM that is shut down must never have been marked (condition %+v): %s", c, describe(v))
	}
	if got := n.metric(t, `lifeboat_agent_graceful_shutdown_signals_total{decision="shutdown"}`); got != 1 {
		t.Errorf("signals with decision shutdown = %v, want 1", got)
	}
}

// expectMarked: the VMI is marked with the node-pressure reason and the kubelet's deadline, and
// the guest keeps running.
func expectMarked(t *testing.T, n *testNode, vmi *v1alpha1.VirtualMachineInstance) *v1alpha1.VirtualMachineInstance {
	t.Helper()
	v := waitVMI(t, vmi.Namespace, vmi.Name, 30*time.Second, "the evacuation mark", marked)
	c := meta.FindStatusCondition(v.Status.Conditions, v1alpha1.VMIConditionEvictionRequested)
	if c == nil || c.Status != metav1.ConditionTrue || c.Reason != "NodePressure" {
		t.Errorf("want EvictionRequested=True, reason NodePressure: %+v", c)
	}
	if v.Status.EvacuationDeadline == nil || !strings.Contains(c.Message, v.Status.EvacuationDeadline.UTC().Format(time.RFC3339)) {
		t.Errorf("the deadline must be on the VMI and in the condition's message: %s", describe(v))
	}
	before := lastCounterAt(t, n.consolePath(v))
	waitCounterPast(t, n.consolePath(v), before+2, 10*time.Second)
	if _, err := os.Stat(n.consolePath(v)); err == nil {
		if b, _ := os.ReadFile(n.consolePath(v)); strings.Contains(string(b), protocol.PowerButton) {
			t.Error("a marked VM must not be shut down")
		}
	}
	waitEvent(t, v.Namespace, v.Name, "EvacuationRequested", 10*time.Second)
	if got := n.metric(t, `lifeboat_agent_graceful_shutdown_signals_total{decision="evacuate"}`); got != 1 {
		t.Errorf("signals with decision evacuate = %v, want 1", got)
	}
	if got := n.metric(t, "lifeboat_agent_mark_latency_seconds_count"); got != 1 {
		t.Errorf("mark latency observations = %v, want 1", got)
	}
	return v
}

func lastCounterAt(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return guest.Counter(string(b))
}

// TestNodePressureMarksLiveMigrateVMs: with the gate on, a LiveMigrate VM evicted by the kubelet
// is marked and keeps running; nothing moves it yet, so when the kubelet's grace period ends it
// is lost, and the agent says so.
func TestNodePressureMarksLiveMigrateVMs(t *testing.T) {
	setConfig(t, true)
	n, vmi := runningVM(t, "pressure-live", strategy(v1alpha1.EvictionStrategyLiveMigrate))
	evicted := evict(t, n, vmi)
	v := expectMarked(t, n, vmi)

	// The evacuation controller turns the mark into a migration that says why and by when.
	m := waitMigration(t, v)
	if m.Status.Cause != v1alpha1.MigrationCauseNodePressure || m.Status.SourceNode != n.Name() ||
		m.Status.Deadline == nil || !m.Status.Deadline.Equal(v.Status.EvacuationDeadline) {
		t.Errorf("migration %s: cause %q source %q deadline %v; want NodePressure, %s, the VMI's deadline %v",
			m.Name, m.Status.Cause, m.Status.SourceNode, m.Status.Deadline, n.Name(), v.Status.EvacuationDeadline)
	}
	waitEvent(t, v.Namespace, v.Name, "EvacuationMigrationCreated", 10*time.Second)

	if err := evicted(); err != nil {
		t.Fatalf("the eviction: %v", err)
	}
	v = waitVMI(t, v.Namespace, v.Name, time.Minute, "the lost evacuation recorded", func(v *v1alpha1.VirtualMachineInstance) bool {
		c := meta.FindStatusCondition(v.Status.Conditions, v1alpha1.VMIConditionEvictionRequested)
		return c != nil && c.Reason == "EvacuationDeadlineExceeded"
	})
	waitEvent(t, v.Namespace, v.Name, "EvacuationDeadlineExceeded", 10*time.Second)
	if got := n.metric(t, "lifeboat_agent_evacuations_lost_total"); got != 1 {
		t.Errorf("evacuations lost = %v, want 1", got)
	}
}

func TestNodePressureWithTheGateOffShutsDown(t *testing.T) {
	setConfig(t, false)
	n, vmi := runningVM(t, "pressure-gate-off", strategy(v1alpha1.EvictionStrategyLiveMigrate))
	evict(t, n, vmi)
	expectShutdown(t, n, vmi)
}

func TestNodePressureWithStrategyNoneShutsDown(t *testing.T) {
	setConfig(t, true)
	n, vmi := runningVM(t, "pressure-none", strategy(v1alpha1.EvictionStrategyNone))
	evict(t, n, vmi)
	expectShutdown(t, n, vmi)
}

func TestNodePressureOnANonMigratableLiveMigrateIfPossibleVMShutsDown(t *testing.T) {
	setConfig(t, true)
	disk := filepath.Join(vmDir(t), "disk.raw")
	if err := os.WriteFile(disk, make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(disk, launcher.UID, launcher.GID); err != nil {
		t.Fatal(err)
	}
	n, vmi := runningVM(t, "pressure-ifpossible", strategy(v1alpha1.EvictionStrategyLiveMigrateIfPossible),
		func(v *v1alpha1.VirtualMachineInstance) { v.Spec.Boot.Disk = disk })
	if c := meta.FindStatusCondition(vmi.Status.Conditions, v1alpha1.VMIConditionLiveMigratable); c == nil || c.Status != metav1.ConditionFalse || c.Reason != "LocalDisk" {
		t.Fatalf("a VM with a local disk must be LiveMigratable=False, reason LocalDisk: %+v", c)
	}
	evict(t, n, vmi)
	expectShutdown(t, n, vmi)
}

func TestNodePressureMarksExternalVMs(t *testing.T) {
	setConfig(t, true)
	n, vmi := runningVM(t, "pressure-external", strategy(v1alpha1.EvictionStrategyExternal))
	evict(t, n, vmi)
	v := expectMarked(t, n, vmi)
	waitEvent(t, v.Namespace, v.Name, "EvacuationLeftToExternalController", 10*time.Second)
	expectNoMigrations(t, v.Namespace, "lifeboat never migrates an External VM")
}

// waitMigration waits for the one migration of a VMI to exist with its status recorded.
func waitMigration(t *testing.T, v *v1alpha1.VirtualMachineInstance) *v1alpha1.VirtualMachineInstanceMigration {
	t.Helper()
	var found *v1alpha1.VirtualMachineInstanceMigration
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
		list, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstanceMigrations(v.Namespace).List(ctx, metav1.ListOptions{
			LabelSelector: v1alpha1.LabelVMIUID + "=" + string(v.UID)})
		if err != nil || len(list.Items) != 1 || list.Items[0].Status.Phase == "" {
			return false, nil
		}
		found = &list.Items[0]
		return true, nil
	})
	if err != nil {
		t.Fatalf("no migration with a recorded status for VMI %s within 20s", v.Name)
	}
	return found
}

// TestAgentKilledBetweenSignalAndMark: the launcher records the signal in the domain, so an agent
// that was down when it came still marks the VM when it returns.
func TestAgentKilledBetweenSignalAndMark(t *testing.T) {
	setConfig(t, true)
	n, vmi := runningVM(t, "pressure-agent-down", strategy(v1alpha1.EvictionStrategyLiveMigrate))
	n.agent.Kill()
	pod := launcherPod(t, vmi)
	evict(t, n, vmi)
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		log, _ := n.ContainerLog(pod, "compute")
		return strings.Contains(log, "SIGTERM: told the agent"), nil
	})
	if err != nil {
		t.Fatal("the launcher did not record the SIGTERM within 10s")
	}
	kubewait.Consistently(t, 5*time.Second, "no mark while no agent runs", func(ctx context.Context) error {
		v, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(vmi.Namespace).Get(ctx, vmi.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if marked(v) {
			return fmt.Errorf("VMI marked: %s", describe(v))
		}
		return nil
	})
	n.agent.start(t)
	expectMarked(t, n, vmi)
}

// TestUserDeletesAMarkedVMI: the user's intent wins over an evacuation.
func TestUserDeletesAMarkedVMI(t *testing.T) {
	setConfig(t, true)
	n, vmi := runningVM(t, "pressure-deleted", strategy(v1alpha1.EvictionStrategyLiveMigrate))
	evict(t, n, vmi)
	v := waitVMI(t, vmi.Namespace, vmi.Name, 30*time.Second, "the evacuation mark", marked)
	if err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(v.Namespace).Delete(context.Background(), v.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := guest.WaitForLine(ctx, n.consolePath(v), protocol.PowerButton); err != nil {
		t.Fatalf("a deleted marked VM must be shut down: %v", err)
	}
	kubewait.Gone(t, time.Minute, "the deleted VMI "+v.Name+" after its guest shut down", func(ctx context.Context) error {
		_, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(v.Namespace).Get(ctx, v.Name, metav1.GetOptions{})
		return err
	})
}
