// Package soak is the soak's plan: which operations a user would do and which faults break
// things, when, and on what, as a pure function of a seed, so that a seed replays its soak. The
// driver that carries a plan out on a cluster of emulated nodes with real guests is the e2e test
// TestSoak (test/e2e/soak_test.go); the checker that judges what it observed is package check.
package soak

import (
	"fmt"
	"math/rand/v2"
	"sort"
	"time"
)

// Kind is a kind of step.
type Kind string

// Operations: what a user or the cluster's own machinery does to VMs.
const (
	// NodePressureEviction: the VM's node's kubelet evicts its launcher pod for memory pressure.
	NodePressureEviction Kind = "node-pressure-eviction"
	// Drain: the node is cordoned and every VM pod on it is evicted through the Eviction API, as
	// kubectl drain does; Uncordon follows after For.
	Drain    Kind = "drain"
	Uncordon Kind = "uncordon"
	// APIEviction: one VM pod evicted through the Eviction API, as the descheduler does.
	APIEviction Kind = "api-eviction"
	// EvictionRequest: one VM pod's eviction asked through the EvictionRequest API
	// (lifecycle.k8s.io), whose responder lifeboat is; the requester waits for lifeboat's answer.
	EvictionRequest Kind = "eviction-request"
	// ManualMigration: a VirtualMachineInstanceMigration created by the user.
	ManualMigration Kind = "manual-migration"
	// Restart: the user deletes the VM's instance; its run strategy starts a new one.
	Restart Kind = "vm-restart"
	// StopStart: the user halts the VM and, after For, starts it again.
	StopStart Kind = "vm-stop-start"
	// Bandwidth: the migrations' bandwidth limit set to Value MiB/s (0: none).
	Bandwidth Kind = "config-bandwidth"
	// PostCopy: post-copy allowed (Value 1) or not (0).
	PostCopy Kind = "config-postcopy"
)

// Faults: what breaks.
const (
	// AgentKill: the node's agent SIGKILLed, started again after For (a node with a migration under
	// way, its source or target, when there is one).
	AgentKill Kind = "agent-kill"
	// ControllerKill: the controller SIGKILLed, started again after For.
	ControllerKill Kind = "controller-kill"
	// LibvirtdKill: the VM's launcher's libvirt daemon SIGKILLed.
	LibvirtdKill Kind = "libvirtd-kill"
	// QEMUKill: the VM's QEMU SIGKILLed: its guest is lost whatever lifeboat does.
	QEMUKill Kind = "qemu-kill"
	// NodeFreeze: every process of the node stopped (kubelet, agent, launchers, QEMUs), resumed after For.
	NodeFreeze Kind = "node-freeze"
	// NodeLost: the node frozen, and once it is NotReady tainted node.kubernetes.io/out-of-service
	// (the admin's word that it is off: Kubernetes' non-graceful node shutdown), so that its VMs'
	// run strategies start them elsewhere; resumed once they run there, and the taint removed. For
	// is the longest it may take.
	NodeLost Kind = "node-lost"
	// NetworkCut: the migration network between two nodes cut for For: what each node's agent
	// sends to the other's address dropped (the two ends of a migration under way, when there is one).
	NetworkCut Kind = "network-cut"
	// NetworkSlow: the same slowed to Value KiB/s each way for For.
	NetworkSlow Kind = "network-slowed"
	// APIServerRestart: kube-apiserver killed, started again after For.
	APIServerRestart Kind = "apiserver-restart"
	// EtcdRestart: etcd killed, started again after For.
	EtcdRestart Kind = "etcd-restart"
)

// Faults are the kinds that are faults.
var Faults = map[Kind]bool{AgentKill: true, ControllerKill: true, LibvirtdKill: true, QEMUKill: true, NodeFreeze: true, NodeLost: true,
	NetworkCut: true, NetworkSlow: true, APIServerRestart: true, EtcdRestart: true}

// Fatal are the faults that may end a guest whatever lifeboat does. NodeLost is not, though the
// out-of-service taint it sets is: a VM restarted before the taint is a loss nothing excuses.
var Fatal = map[Kind]bool{QEMUKill: true}

// NodeLostFor is how long a NodeLost fault may take: the node found NotReady (the node lifecycle
// controller's grace), the VMs booted elsewhere, the old QEMUs ended once it resumes.
const NodeLostFor = 4 * time.Minute

// Step is one thing to do At after the soak's start, to VM and Node (indexes; each kind uses
// what it needs), lasting For where the kind has an end (a drain's uncordon, a stop's start, a
// killed process's restart, a freeze's resume), with Value for configuration changes.
type Step struct {
	At    time.Duration
	Kind  Kind
	VM    int
	Node  int
	For   time.Duration
	Value int
}

func (s Step) String() string {
	return fmt.Sprintf("+%s %s vm=%d node=%d for=%s value=%d", s.At.Round(time.Second), s.Kind, s.VM, s.Node, s.For, s.Value)
}

// weighted is a kind and how often it is drawn against the others of its list.
type weighted struct {
	kind   Kind
	weight int
}

var operations = []weighted{
	{NodePressureEviction, 4}, {Drain, 2}, {APIEviction, 3}, {ManualMigration, 4},
	{Restart, 1}, {StopStart, 1}, {Bandwidth, 1}, {PostCopy, 1},
}

var faults = []weighted{
	{AgentKill, 3}, {ControllerKill, 2}, {LibvirtdKill, 1}, {QEMUKill, 1}, {NodeFreeze, 2},
}

// Pace is how often things happen: an operation every OperationEvery and a fault every
// FaultEvery on average, and how long a fault lasts at most.
type Pace struct {
	OperationEvery, FaultEvery, FaultFor time.Duration
}

// DefaultPace suits a machine where a TCG guest's migration takes some seconds.
var DefaultPace = Pace{OperationEvery: 15 * time.Second, FaultEvery: 40 * time.Second, FaultFor: 20 * time.Second}

// Plan is the soak of the seed: its steps in time order over d, on vms VMs and nodes nodes. Faults
// come one at a time (the next starts only once the last has ended), so that a loss can be blamed
// on the one fault before it; operations go on meanwhile. Nothing starts in the last quarter of d,
// which is left to settle; a drain's uncordon and a stop's start come before d ends.
func Plan(seed uint64, d time.Duration, vms, nodes int, pace Pace) []Step {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	end := d * 3 / 4
	var out []Step
	// Operations and faults are drawn from one generator in turn, so one seed gives one plan. A
	// second one turns some API evictions into EvictionRequests, some freezes into lost nodes and
	// some agent kills into the migration network cut or slowed (each breaks the path between two
	// nodes' agents), so that the kinds the soak learnt later leave the older kinds' draws, and the seeds' recorded
	// plans, as they were.
	variant := rand.New(rand.NewPCG(seed^0x5851f42d4c957f2d, seed))
	// A third turns some controller kills into kube-apiserver or etcd restarts (each takes the
	// cluster's control away for a while); it leaves the second's draws as they were.
	controlPlane := rand.New(rand.NewPCG(seed^0x2545f4914f6cdd1d, seed))
	nextOp := jitter(r, pace.OperationEvery)
	nextFault := jitter(r, pace.FaultEvery)
	var drainedUntil time.Duration
	for nextOp < end || nextFault < end {
		if nextOp <= nextFault {
			s := Step{At: nextOp, Kind: draw(r, operations), VM: r.IntN(vms), Node: r.IntN(nodes)}
			switch s.Kind {
			case Drain:
				// One node drained at a time: draining a second while the first is cordoned
				// could leave a VM nowhere to go on three nodes.
				if s.At < drainedUntil {
					s.Kind = ManualMigration
					break
				}
				s.For = min(time.Duration(30+r.IntN(30))*time.Second, d-s.At)
				drainedUntil = s.At + s.For
				out = append(out, Step{At: s.At + s.For, Kind: Uncordon, Node: s.Node})
			case StopStart:
				s.For = min(time.Duration(5+r.IntN(15))*time.Second, d-s.At)
			case APIEviction:
				if variant.IntN(2) == 0 {
					s.Kind = EvictionRequest
				}
			case Bandwidth:
				s.Value = []int{0, 8, 32, 128}[r.IntN(4)]
			case PostCopy:
				s.Value = r.IntN(2)
			}
			out = append(out, s)
			nextOp += jitter(r, pace.OperationEvery)
			continue
		}
		s := Step{At: nextFault, Kind: draw(r, faults), VM: r.IntN(vms), Node: r.IntN(nodes)}
		switch s.Kind {
		case AgentKill, ControllerKill, NodeFreeze:
			s.For = time.Duration(1+r.Int64N(int64(pace.FaultFor/time.Second))) * time.Second
		}
		switch {
		case s.Kind == NodeFreeze && s.At+NodeLostFor <= end && variant.IntN(2) == 0:
			s.Kind, s.For = NodeLost, NodeLostFor
		case s.Kind == ControllerKill && controlPlane.IntN(2) == 0:
			s.Kind = []Kind{APIServerRestart, EtcdRestart}[controlPlane.IntN(2)]
		case s.Kind == AgentKill && variant.IntN(2) == 0:
			// Long enough for a migration to meet it.
			s.Kind, s.For = NetworkCut, 2*s.For
			if variant.IntN(2) == 0 {
				s.Kind, s.Value = NetworkSlow, []int{256, 1024}[variant.IntN(2)]
			}
		}
		out = append(out, s)
		nextFault += s.For + jitter(r, pace.FaultEvery)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].At < out[j].At })
	return out
}

// jitter is a wait of mean about every: uniform between half of it and one and a half of it.
func jitter(r *rand.Rand, every time.Duration) time.Duration {
	return every/2 + time.Duration(r.Int64N(int64(every)))
}

func draw(r *rand.Rand, from []weighted) Kind {
	total := 0
	for _, w := range from {
		total += w.weight
	}
	n := r.IntN(total)
	for _, w := range from {
		if n < w.weight {
			return w.kind
		}
		n -= w.weight
	}
	panic("unreachable")
}
