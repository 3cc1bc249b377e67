package check

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	lifecyclev1alpha1 "k8s.io/api/lifecycle/v1alpha1"
	policyv1 "k8s.io/api/policy/v1"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

// Objects is what a user lists through the API at one moment: lifeboat's public kinds and the
// Kubernetes objects beside them.
type Objects struct {
	VMs        []v1alpha1.VirtualMachine
	VMIs       []v1alpha1.VirtualMachineInstance
	Migrations []v1alpha1.VirtualMachineInstanceMigration
	Pods       []corev1.Pod
	Nodes      []corev1.Node
	Budgets    []policyv1.PodDisruptionBudget
	Evictions  []lifecyclev1alpha1.Eviction
	// Cordoned are the nodes the user (the soak) cordoned: any other unschedulable node is a cordon
	// someone else made.
	Cordoned map[string]bool
}

// SnapshotOf reads the user-visible state of o into a Snapshot taken at at.
func SnapshotOf(at time.Time, o Objects) Snapshot {
	s := Snapshot{At: at}
	vmis := map[string]*v1alpha1.VirtualMachineInstance{}
	for i := range o.VMIs {
		v := &o.VMIs[i]
		vmis[v.Namespace+"/"+v.Name] = v
		if v.Status.EvacuationNodeName != "" && v.Status.EvacuationNodeName == v.Status.NodeName && !v.Status.Phase.Terminal() {
			s.Holds = append(s.Holds, Hold{Kind: HoldMark, Name: v.Namespace + "/" + v.Name + "@" + v.Status.NodeName})
		}
	}
	for _, vm := range o.VMs {
		out := VM{Name: vm.Namespace + "/" + vm.Name, WantRunning: vm.Spec.RunStrategy != v1alpha1.RunStrategyHalted,
			LiveMigrate: vm.Spec.Template.Spec.EvictionStrategy != nil && *vm.Spec.Template.Spec.EvictionStrategy == v1alpha1.EvictionStrategyLiveMigrate}
		if v := vmis[vm.Namespace+"/"+vm.Name]; v != nil {
			out.Instance, out.Phase, out.Node = string(v.UID), string(v.Status.Phase), v.Status.NodeName
		}
		s.VMs = append(s.VMs, out)
	}
	targets := map[string]bool{}
	for _, m := range o.Migrations {
		name := m.Namespace + "/" + m.Name
		s.Migrations = append(s.Migrations, Migration{Name: name, VM: m.Namespace + "/" + m.Spec.VMIName, Cause: string(m.Status.Cause), Phase: string(m.Status.Phase)})
		if !m.Status.Phase.Terminal() {
			s.Holds = append(s.Holds, Hold{Kind: HoldMigration, Name: name})
			if m.Status.TargetPod != "" {
				targets[m.Namespace+"/"+m.Status.TargetPod] = true
			}
		}
	}
	for _, p := range o.Pods {
		// A target pod that neither runs nor ended: pending, or left behind by its migration.
		if targets[p.Namespace+"/"+p.Name] && p.Status.Phase == corev1.PodPending {
			s.Holds = append(s.Holds, Hold{Kind: HoldTargetPod, Name: p.Namespace + "/" + p.Name})
		}
	}
	for _, b := range o.Budgets {
		if b.Spec.MinAvailable != nil && b.Spec.MinAvailable.IntValue() >= 2 {
			s.Holds = append(s.Holds, Hold{Kind: HoldBudget, Name: b.Namespace + "/" + b.Name})
		}
	}
	live := map[string]bool{}
	for _, p := range o.Pods {
		if p.DeletionTimestamp == nil && p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
			live[string(p.UID)] = true
		}
	}
	for _, ev := range o.Evictions {
		if pod := ev.Spec.Target.Pod; pod != nil && live[string(pod.UID)] && awaitsLifeboat(ev) {
			s.Holds = append(s.Holds, Hold{Kind: HoldEviction, Name: ev.Namespace + "/" + ev.Name})
		}
	}
	for _, n := range o.Nodes {
		if n.Spec.Unschedulable && !o.Cordoned[n.Name] {
			s.Holds = append(s.Holds, Hold{Kind: HoldCordon, Name: n.Name})
		}
	}
	return s
}

// awaitsLifeboat says lifeboat is the Eviction's active responder and has not said it completed.
func awaitsLifeboat(ev lifecyclev1alpha1.Eviction) bool {
	active := false
	for _, r := range ev.Status.TargetResponders {
		if r.Name == v1alpha1.EvictionResponderName && r.State == lifecyclev1alpha1.ResponderStateActive {
			active = true
		}
	}
	if !active {
		return false
	}
	for _, r := range ev.Status.Responders {
		if r.Name == v1alpha1.EvictionResponderName && r.CompletionTime != nil {
			return false
		}
	}
	return true
}
