package main

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/evacuation/check"
	"github.com/lifeboat-vm/lifeboat/evacuation/disruption"
	"github.com/lifeboat-vm/lifeboat/evacuation/vm"
	"github.com/lifeboat-vm/lifeboat/evacuation/webhook"
)

// status tells the VM's story: its state, its instance, what protects it now and what a drain
// or memory pressure on its node would do to it, the evacuation mark with its cause and
// deadline, and its latest migration. What it may not read (a namespace user may not list
// nodes) it says it does not know.
func (c *client) status(ctx context.Context, name string, now time.Time) error {
	v, i, err := c.get(ctx, name)
	if err != nil {
		return err
	}
	fmt.Fprintf(c.out, "VM %s/%s: %s, ready %v, run strategy %s, %d restart(s)\n", v.Namespace, v.Name, v.Status.PrintableStatus, v.Status.Ready, v.Spec.RunStrategy, v.Status.Restarts)
	if i == nil {
		fmt.Fprintln(c.out, "no instance")
		return nil
	}
	fmt.Fprintf(c.out, "instance %s: phase %s on node %s\n", i.UID, i.Status.Phase, i.Status.NodeName)
	if cond := meta.FindStatusCondition(i.Status.Conditions, v1alpha1.VMIConditionNodeLost); cond != nil && cond.Status == metav1.ConditionTrue {
		// The node stopped answering: what to do, as the VMI controller wrote it.
		fmt.Fprintf(c.out, "waiting for its node: %s\n", cond.Message)
	}
	if i.Status.EvacuationNodeName != "" {
		cause := ""
		if cond := meta.FindStatusCondition(i.Status.Conditions, v1alpha1.VMIConditionEvictionRequested); cond != nil {
			cause = ", cause " + cond.Reason
		}
		deadline := ""
		if d := i.Status.EvacuationDeadline; d != nil {
			deadline = fmt.Sprintf(", deadline %s (in %s)", d.Format(time.RFC3339), d.Sub(now).Truncate(time.Second))
		}
		fmt.Fprintf(c.out, "marked for evacuation from node %s%s%s\n", i.Status.EvacuationNodeName, cause, deadline)
	}
	c.protection(ctx, i)
	list, err := c.lb.LifeboatV1alpha1().VirtualMachineInstanceMigrations(v.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("listing the migrations of VM %s/%s: %w", v.Namespace, v.Name, err)
	}
	// This instance's: a user's migration names the VMI only; lifeboat's carry its UID too.
	migrations := slices.DeleteFunc(list.Items, func(m v1alpha1.VirtualMachineInstanceMigration) bool {
		uid, labelled := m.Labels[v1alpha1.LabelVMIUID]
		return m.Spec.VMIName != i.Name || (labelled && uid != string(i.UID)) || m.CreationTimestamp.Before(&i.CreationTimestamp)
	})
	if len(migrations) == 0 {
		return nil
	}
	latest := slices.MaxFunc(migrations, func(a, b v1alpha1.VirtualMachineInstanceMigration) int {
		return a.CreationTimestamp.Compare(b.CreationTimestamp.Time)
	})
	fmt.Fprintln(c.out, vm.MigrationLine(&latest, now))
	return nil
}

// protection prints what protects the instance now ("Protected by") and what a drain and memory
// pressure would do to it (check.IfDrained, check.IfOutOfMemory).
func (c *client) protection(ctx context.Context, i *v1alpha1.VirtualMachineInstance) {
	config, configErr := check.Optional(c.lb.LifeboatV1alpha1().LifeboatConfigs().Get(ctx, v1alpha1.ConfigName, metav1.GetOptions{}))
	var nodes []corev1.Node
	nodeList, nodesErr := c.kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if nodesErr == nil {
		nodes = nodeList.Items
		if nodes == nil {
			nodes = []corev1.Node{}
		}
	}
	facts := check.FactsOf(i, config, nodes)
	protection := check.ProtectionOf(config)
	cluster := check.ClusterFacts{Gate: protection.Gate, Bandwidth: protection.Bandwidth, Margin: protection.Margin}

	fmt.Fprintln(c.out, "Protected by:")
	line := func(format string, args ...any) { fmt.Fprintf(c.out, "  "+format+"\n", args...) }
	if configErr != nil {
		line("LifeboatConfig: unknown, cannot read it (%v)", configErr)
	} else if config == nil {
		line("LifeboatConfig: none (%s): no default eviction strategy, the feature gate off", v1alpha1.ConfigName)
	}
	if config != nil {
		switch cond := meta.FindStatusCondition(config.Status.Conditions, v1alpha1.ConfigConditionReady); {
		case cond == nil:
			line("lifeboat controller: Ready not recorded (the controller of this release writes it)")
		case cond.Status == metav1.ConditionTrue:
			line("lifeboat controller: Ready %s (%s)", cond.Status, cond.Reason)
		default:
			line("lifeboat controller: Ready %s (%s): %s", cond.Status, cond.Reason, cond.Message)
		}
	}
	if configErr != nil && i.Spec.EvictionStrategy == nil {
		line("eviction strategy: unknown, the VMI sets none and the LifeboatConfig's default cannot be read")
	} else {
		line("eviction strategy %s, from %s", facts.Strategy, facts.StrategyFrom)
	}
	switch {
	case facts.Migratable:
		line("live migration: possible")
	case facts.NotMigratable != "":
		line("live migration: not possible, %s", facts.NotMigratable)
	case facts.Running:
		line("live migration: not known yet (its agent has not reported)")
	}
	if facts.Running {
		switch {
		case facts.NodesUnknown:
			line("other nodes: unknown, cannot list the nodes (%v)", nodesErr)
		case len(facts.OtherNodes) == 0:
			line("other nodes: none it may run on, so it cannot leave node %s", facts.Node)
		default:
			line("other nodes: %d it may run on (%s)", len(facts.OtherNodes), firstFew(facts.OtherNodes))
		}
	}

	hook, hookErr := check.Optional(c.kube.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, webhook.ConfigurationName, metav1.GetOptions{}))
	cluster.WebhookKnown = hookErr == nil
	if hookErr == nil {
		r := check.Webhook(hook, webhook.WebhookName, nil)
		// A Service's endpoints are check's to count; registered with a CA bundle is enough here.
		cluster.Webhook = hook != nil && slices.ContainsFunc(hook.Webhooks, func(w admissionregistrationv1.ValidatingWebhook) bool {
			return w.Name == webhook.WebhookName && len(w.ClientConfig.CABundle) > 0
		})
		mode := "mode not recorded"
		if config != nil {
			if cond := meta.FindStatusCondition(config.Status.Conditions, v1alpha1.ConfigConditionEvictionWebhookStrict); cond != nil {
				mode = "permissive (" + cond.Reason + "): it also acts, within bounds, on reviews it cannot authenticate"
				if cond.Status == metav1.ConditionTrue {
					mode = "strict (" + cond.Reason + "): it acts only for the API server"
				}
			}
		}
		if cluster.Webhook {
			line("eviction webhook %s: registered, %s", webhook.ConfigurationName, mode)
		} else {
			line("eviction webhook %s: %s", webhook.ConfigurationName, r.Message)
		}
	} else {
		line("eviction webhook: unknown, cannot read ValidatingWebhookConfiguration %s (%v)", webhook.ConfigurationName, hookErr)
	}

	budget, budgetErr := check.Optional(c.kube.PolicyV1().PodDisruptionBudgets(i.Namespace).Get(ctx, disruption.BudgetName(i), metav1.GetOptions{}))
	switch {
	case budgetErr != nil:
		line("disruption budget: unknown, cannot read PodDisruptionBudget %s (%v)", disruption.BudgetName(i), budgetErr)
	case budget == nil:
		line("disruption budget: none, so an eviction that the webhook lets through (or that comes while it is down) takes the pod")
	default:
		line("disruption budget %s: minAvailable %s, %d disruption(s) allowed now", budget.Name, budget.Spec.MinAvailable, budget.Status.DisruptionsAllowed)
	}

	gate := "off: a node-pressure eviction shuts the VM down"
	if protection.Gate {
		gate = "on: a node-pressure eviction becomes an evacuation, as its strategy says"
	}
	if configErr != nil {
		gate = "unknown (it is the LifeboatConfig's)"
	}
	line("feature gate %s %s", v1alpha1.FeatureGateNodePressureEvictionLiveMigration, gate)
	if facts.Running {
		var node *corev1.Node
		for n := range nodes {
			if nodes[n].Name == facts.Node {
				node = &nodes[n]
			}
		}
		if node == nil && nodesErr != nil {
			node, _ = check.Optional(c.kube.CoreV1().Nodes().Get(ctx, facts.Node, metav1.GetOptions{}))
		}
		switch exposure, err := exposureOf(node); {
		case node == nil:
			line("node %s: unknown, cannot read it", facts.Node)
		case err != nil:
			line("node %s: its %s annotation is unreadable (%v)", facts.Node, v1alpha1.AnnotationEvictionExposure, err)
		case exposure == nil:
			line("node %s: its agent has published no eviction exposure (%s)", facts.Node, v1alpha1.AnnotationEvictionExposure)
		default:
			cluster.Exposure = exposure
			relief := "relief off"
			if exposure.Relief {
				relief = "relief on, margin " + protection.Margin
			}
			line("node %s: %s; %s (its agent, kubelet settings from %s)", facts.Node, relief, exposure.Message, exposure.Source)
		}
	}
	drained, pressure := check.IfDrained(facts, cluster), check.IfOutOfMemory(facts, cluster)
	if configErr != nil && facts.Running {
		// Its default strategy, the feature gate and relief's margin are the LifeboatConfig's.
		unknown := check.Fate{Verdict: check.VerdictUnknown, Why: "the LifeboatConfig cannot be read, and its eviction strategy, feature gate and relief decide; ask a cluster admin to run kubectl lifeboat status"}
		if i.Spec.EvictionStrategy == nil {
			drained = unknown
		}
		pressure = unknown
	}
	fmt.Fprintln(c.out, "If its node were drained:")
	line("%s", drained)
	fmt.Fprintln(c.out, "If its node ran out of memory:")
	line("%s", pressure)
}

// exposureOf is the node's published eviction exposure, nil if it has none.
func exposureOf(node *corev1.Node) (*v1alpha1.NodeEvictionExposure, error) {
	if node == nil {
		return nil, nil
	}
	raw, ok := node.Annotations[v1alpha1.AnnotationEvictionExposure]
	if !ok {
		return nil, nil
	}
	var e v1alpha1.NodeEvictionExposure
	if err := json.Unmarshal([]byte(raw), &e); err != nil {
		return nil, err
	}
	return &e, nil
}

func firstFew(names []string) string {
	out := strings.Join(names[:min(len(names), 3)], ", ")
	if len(names) > 3 {
		out += ", …"
	}
	return out
}
