package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/test/node"
)

// nodeMemory is an emulated node's memory as its agent reads it: a /proc/meminfo and a cgroup v2
// root memory.stat the test writes, so that memory.available moves as the test says.
type nodeMemory struct{ dir string }

const reliefCapacity = 8 << 30

func (m nodeMemory) set(t *testing.T, available uint64) {
	t.Helper()
	used := reliefCapacity - available
	for name, content := range map[string]string{
		"meminfo":     fmt.Sprintf("MemTotal:       %d kB\n", reliefCapacity>>10),
		"memory.stat": fmt.Sprintf("anon %d\nfile 0\ninactive_file 0\n", used),
	} {
		// Written whole and renamed, so the agent never reads half a file.
		tmp := filepath.Join(m.dir, name+".tmp")
		if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(m.dir, name)); err != nil {
			t.Fatal(err)
		}
	}
}

// TestReliefMovesAVMBeforeTheKubeletHasToEvict: with node-pressure relief on, a node whose
// memory.available comes within the margin of its kubelet's soft threshold has its LiveMigrate VM
// marked (cause NodePressureRelief, no deadline) and moved to the other node by a live migration,
// with no eviction at all; Events on the Node and the VMI say why, and the agent counts it. (That
// nothing moves above the line is agent.TestReliefMarksTheVMsTheKubeletWouldEvictFirst's and
// pressure.TestRelieve's.)
func TestReliefMovesAVMBeforeTheKubeletHasToEvict(t *testing.T) {
	setConfig(t, true, func(c *v1alpha1.LifeboatConfig) {
		c.Spec.NodePressureRelief = &v1alpha1.NodePressureReliefConfig{Enabled: ptr.To(true), Margin: ptr.To(resource.MustParse("512Mi"))}
	})
	startController(t)
	kubeletConfig := filepath.Join(t.TempDir(), "kubelet.yaml")
	if err := os.WriteFile(kubeletConfig, []byte(fmt.Sprintf(
		"kind: KubeletConfiguration\napiVersion: kubelet.config.k8s.io/v1beta1\nevictionSoft:\n  memory.available: 2Gi\nevictionMaxPodGracePeriod: %d\n",
		evictionMaxPodGracePeriod)), 0o644); err != nil {
		t.Fatal(err)
	}
	memory := map[string]nodeMemory{}
	nodes := startNodesWithAgentArgs(t, 2, func(n *node.Node) []string {
		m := nodeMemory{dir: t.TempDir()}
		m.set(t, 4<<30)
		memory[n.Name()] = m
		return []string{"--kubelet-config", kubeletConfig, "--proc-root", m.dir, "--cgroup-root", m.dir}
	})
	ns := testNamespace(t)
	vmi := createVMI(t, ns, newVMI("relieved", strategy(v1alpha1.EvictionStrategyLiveMigrate), func(v *v1alpha1.VirtualMachineInstance) {
		v.Spec.Memory = resource.MustParse("256Mi")
	}))
	vmi = waitVMI(t, ns, vmi.Name, bootTimeout, "phase Running and live-migratable", func(v *v1alpha1.VirtualMachineInstance) bool {
		ok, _ := v.LiveMigratable()
		return running(v) && ok
	})
	source := nodeOf(t, nodes, vmi)
	before := waitCounterPast(t, source.consolePath(vmi), 0, bootTimeout)

	// 2.3 GiB available: 200 MiB under the soft threshold plus the margin (2.5 GiB), still 300 MiB
	// above the threshold, where the kubelet would start to evict.
	const available = 2355 << 20
	memory[source.Name()].set(t, available)
	moved := waitVMI(t, ns, vmi.Name, 2*time.Minute, "the VM moved to the other node by relief", func(v *v1alpha1.VirtualMachineInstance) bool {
		return v.Status.NodeName != "" && v.Status.NodeName != source.Name() && v.Status.MigrationState != nil && v.Status.MigrationState.Completed
	})
	target := nodeOf(t, nodes, moved)
	if s := moved.Status.MigrationState; s.Cause != v1alpha1.MigrationCauseNodePressureRelief || s.SourceNode != source.Name() {
		t.Errorf("migration state %+v: want cause NodePressureRelief from %s", s, source.Name())
	}
	m := waitMigrationEnded(t, moved)
	if m.Status.Phase != v1alpha1.MigrationSucceeded || m.Status.Deadline != nil || m.Status.Mode != v1alpha1.MigrationModePreCopy {
		t.Errorf("migration %s: phase %s, deadline %v, mode %s; want Succeeded without a deadline, by pre-copy", m.Name, m.Status.Phase, m.Status.Deadline, m.Status.Mode)
	}
	waitCounterPast(t, target.consolePath(moved), before+2, 30*time.Second)
	waitEvent(t, metav1.NamespaceDefault, source.Name(), string(v1alpha1.MigrationCauseNodePressureRelief), 10*time.Second)
	waitEvent(t, ns, vmi.Name, string(v1alpha1.MigrationCauseNodePressureRelief), 10*time.Second)
	// The source, short of memory, is labelled so that no migration targets it; the target is not.
	for n, want := range map[string]string{source.Name(): "true", target.Name(): ""} {
		node, err := cluster.Kube.CoreV1().Nodes().Get(context.Background(), n, metav1.GetOptions{})
		if err != nil || node.Labels[v1alpha1.LabelMemoryPressureRelief] != want {
			t.Errorf("node %s: %v, label %s=%q, want %q", n, err, v1alpha1.LabelMemoryPressureRelief, node.Labels[v1alpha1.LabelMemoryPressureRelief], want)
		}
	}
	if got := source.metric(t, `lifeboat_agent_node_pressure_relief_total{result="marked"}`); got != 1 {
		t.Errorf("lifeboat_agent_node_pressure_relief_total{result=\"marked\"} = %v on %s, want 1", got, source.Name())
	}
	if got := source.metric(t, "lifeboat_agent_node_memory_available_bytes"); got != available {
		t.Errorf("lifeboat_agent_node_memory_available_bytes = %v on %s, want %d", got, source.Name(), available)
	}
	// No eviction: the launcher pod on the source ended because its guest left, not by the kubelet.
	if got := source.metric(t, `lifeboat_agent_graceful_shutdown_signals_total{decision="evacuate"}`); got != 0 {
		t.Errorf("the source's launcher got a SIGTERM (%v evacuations decided); relief should have needed none", got)
	}
}
