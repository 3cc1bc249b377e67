package e2e

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/lifeboat-vm/lifeboat/agent"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/test/kubewait"
	"github.com/lifeboat-vm/lifeboat/test/node"
)

// TestAnAgentOnADefaultKubeletPublishesTheRisk: with relief turned off, the agent of a node whose
// kubelet has the upstream defaults (a hard threshold alone: one second's grace) finds that its
// VM cannot migrate in time and says so: the Node's annotation, a Warning VMsAtRisk Event on the
// Node, its metric, and the LifeboatConfig's VMsAtRisk condition naming the node. The agent of
// a node with a generous soft threshold and grace says its VM fits, and is not named. With relief
// left unset, relief comes on for the default node alone and the condition clears.
func TestAnAgentOnADefaultKubeletPublishesTheRisk(t *testing.T) {
	setConfig(t, true, func(c *v1alpha1.LifeboatConfig) {
		c.Spec.Migrations.BandwidthPerMigration = ptr.To(resource.MustParse("64Mi"))
		c.Spec.NodePressureRelief = &v1alpha1.NodePressureReliefConfig{Enabled: ptr.To(false)}
	})
	startController(t)
	dir := t.TempDir()
	configs := map[string]string{
		"defaults": "kind: KubeletConfiguration\napiVersion: kubelet.config.k8s.io/v1beta1\n",
		"generous": "kind: KubeletConfiguration\napiVersion: kubelet.config.k8s.io/v1beta1\n" +
			"evictionSoft: {memory.available: 2Gi}\nevictionSoftGracePeriod: {memory.available: 30s}\nevictionMaxPodGracePeriod: 60\n",
	}
	for name, content := range configs {
		if err := os.WriteFile(filepath.Join(dir, name+".yaml"), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// The first node's kubelet has the defaults, the second's the generous settings. Each agent
	// reads a node memory the test writes, far above any threshold, so relief never moves a VM.
	kinds := []string{"defaults", "generous"}
	started := 0
	nodes := startNodesWithAgentArgs(t, 2, func(n *node.Node) []string {
		m := nodeMemory{dir: t.TempDir()}
		m.set(t, 6<<30)
		kind := kinds[started]
		started++
		return []string{"--kubelet-config", filepath.Join(dir, kind+".yaml"), "--proc-root", m.dir, "--cgroup-root", m.dir}
	})
	defaults, generous := nodes[0], nodes[1]
	ns := testNamespace(t)
	for _, n := range nodes {
		createVMI(t, ns, newVMI("on-"+n.Name(), strategy(v1alpha1.EvictionStrategyLiveMigrate), func(v *v1alpha1.VirtualMachineInstance) {
			v.Spec.Memory = resource.MustParse("256Mi")
			v.Spec.NodeSelector = map[string]string{corev1.LabelHostname: n.Name()}
		}))
	}
	for _, n := range nodes {
		waitVMI(t, ns, "on-"+n.Name(), bootTimeout, "phase Running", running)
	}

	defaultsExposure := waitExposure(t, defaults.Name(), "at risk", func(e v1alpha1.NodeEvictionExposure) bool { return e.AtRisk })
	if defaultsExposure.Source != agent.KubeletSourceFile || defaultsExposure.Threshold != "hard" || defaultsExposure.GraceSeconds != 1 ||
		defaultsExposure.MigrationSeconds != 6 || defaultsExposure.Relief {
		t.Errorf("node %s (upstream defaults): %+v; want the hard threshold with 1 s, a 6 s migration (a target's 2 s start, then 256Mi at 64Mi/s), relief off", defaults.Name(), defaultsExposure)
	}
	generousExposure := waitExposure(t, generous.Name(), "reporting its VM", func(e v1alpha1.NodeEvictionExposure) bool { return e.LargestVMBytes > 0 })
	if generousExposure.AtRisk || generousExposure.Threshold != "soft" || generousExposure.GraceSeconds < generousExposure.MigrationSeconds {
		t.Errorf("node %s (generous soft threshold): %+v; want the soft threshold with a grace the migration fits in", generous.Name(), generousExposure)
	}
	e := waitEvent(t, metav1.NamespaceDefault, defaults.Name(), agent.ReasonVMsAtRisk, 30*time.Second)
	if e.Type != corev1.EventTypeWarning || !strings.Contains(e.Message, "does not fit") {
		t.Errorf("Event %s %s: %q; want a Warning saying the migration does not fit", e.Type, e.Reason, e.Message)
	}
	if got := defaults.metric(t, "lifeboat_agent_node_vms_at_risk"); got != 1 {
		t.Errorf("lifeboat_agent_node_vms_at_risk = %v on %s, want 1", got, defaults.Name())
	}
	if got := generous.metric(t, "lifeboat_agent_node_vms_at_risk"); got != 0 {
		t.Errorf("lifeboat_agent_node_vms_at_risk = %v on %s, want 0", got, generous.Name())
	}
	cond := waitVMsAtRisk(t, "True", func(c *metav1.Condition) bool { return c.Status == metav1.ConditionTrue })
	if !strings.Contains(cond.Message, defaults.Name()) || strings.Contains(cond.Message, generous.Name()) {
		t.Errorf("VMsAtRisk: %q; want node %s named and node %s not", cond.Message, defaults.Name(), generous.Name())
	}
	events, err := cluster.Kube.CoreV1().Events(metav1.NamespaceDefault).List(context.Background(), metav1.ListOptions{
		FieldSelector: fields.Set{"involvedObject.name": generous.Name(), "reason": agent.ReasonVMsAtRisk}.String()})
	if err != nil || len(events.Items) > 0 {
		t.Errorf("VMsAtRisk Events on node %s: %v, %d; want none", generous.Name(), err, len(events.Items))
	}

	// Relief left unset: on where the grace is too short, so nothing is at risk any more.
	config, err := cluster.Lifeboat.LifeboatV1alpha1().LifeboatConfigs().Get(context.Background(), v1alpha1.ConfigName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	config.Spec.NodePressureRelief = nil
	if _, err := cluster.Lifeboat.LifeboatV1alpha1().LifeboatConfigs().Update(context.Background(), config, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitExposure(t, defaults.Name(), "relieved instead", func(e v1alpha1.NodeEvictionExposure) bool { return e.Relief && !e.AtRisk })
	waitExposure(t, generous.Name(), "still saved by its grace, without relief", func(e v1alpha1.NodeEvictionExposure) bool { return !e.Relief && !e.AtRisk })
	waitVMsAtRisk(t, "False", func(c *metav1.Condition) bool { return c.Status == metav1.ConditionFalse })
	waitEvent(t, metav1.NamespaceDefault, defaults.Name(), agent.ReasonVMsNoLongerAtRisk, 30*time.Second)
	if got := defaults.metric(t, "lifeboat_agent_node_pressure_relief_on"); got != 1 {
		t.Errorf("lifeboat_agent_node_pressure_relief_on = %v on %s, want 1", got, defaults.Name())
	}
}

// waitExposure waits until the node's published eviction exposure satisfies ok.
func waitExposure(t *testing.T, nodeName, what string, ok func(v1alpha1.NodeEvictionExposure) bool) v1alpha1.NodeEvictionExposure {
	t.Helper()
	var e v1alpha1.NodeEvictionExposure
	var last string
	err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		n, err := cluster.Kube.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		last = n.Annotations[v1alpha1.AnnotationEvictionExposure]
		e = v1alpha1.NodeEvictionExposure{}
		return last != "" && json.Unmarshal([]byte(last), &e) == nil && ok(e), nil
	})
	if err != nil {
		t.Fatalf("node %s never published an eviction exposure %s; last %s", nodeName, what, last)
	}
	return e
}

// waitVMsAtRisk waits until the LifeboatConfig's VMsAtRisk condition satisfies ok.
func waitVMsAtRisk(t *testing.T, what string, ok func(*metav1.Condition) bool) metav1.Condition {
	t.Helper()
	c := kubewait.For(t, 60*time.Second, "the LifeboatConfig's VMsAtRisk "+what, getConfig, func(c *v1alpha1.LifeboatConfig) bool {
		cond := meta.FindStatusCondition(c.Status.Conditions, v1alpha1.ConfigConditionVMsAtRisk)
		return cond != nil && ok(cond)
	}, showConfigStatus)
	return *meta.FindStatusCondition(c.Status.Conditions, v1alpha1.ConfigConditionVMsAtRisk)
}

// TestTheAgentReadsTheRealKubeletsLiveConfiguration: lifeboat deployed from manifests/ (which
// mount nothing of the node's configuration) reads the real kubelet's eviction settings from its
// /configz with the agent's own token and RBAC nodes/configz: its soft threshold (1Gi, above the
// hard 100Mi) acts first, with the kubelet's evictionMaxPodGracePeriod.
func TestTheAgentReadsTheRealKubeletsLiveConfiguration(t *testing.T) {
	real := startRealNode(t)
	deployLifeboat(t, real)
	e := waitExposure(t, real.Name(), "read from the kubelet's /configz", func(e v1alpha1.NodeEvictionExposure) bool {
		return e.Source == agent.KubeletSourceConfigz
	})
	if e.Threshold != "soft" || e.AtRisk {
		t.Errorf("node %s: %+v; want the soft threshold acting first, nothing at risk", real.Name(), e)
	}
}
