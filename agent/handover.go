package agent

import (
	"context"
	"log/slog"
	"net/netip"
	"os"
	"time"

	"golang.org/x/sys/unix"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/lifeboat-vm/lifeboat/agent/podnetwork"
	contract "github.com/lifeboat-vm/lifeboat/api/launcher"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

// A migrated guest's Service reaches its new pod only once the VMI's node has moved, the
// target pod's readiness gate is set, the EndpointSlice controller has listed it and every
// Service proxy has rewritten its rules: several hundred milliseconds after the guest runs
// there. Until then, connections keep coming to the source pod, whose guest has gone. The
// source agent therefore makes the source pod forward them to the target pod the moment the
// migration ends, and keeps that until no EndpointSlice lists the source pod any more and the
// proxies have had time to follow.

// HandoverInput is what the source agent knows when libvirt's migration call returned.
type HandoverInput struct {
	// Migrated says the guest left this node by the migration.
	Migrated bool
	// Plan is the source pod's network plan; ok false if the VMI has no pod interface.
	Plan   podnetwork.Plan
	HasNet bool
	// SourceIP and TargetIP are the pods' addresses as their status says.
	SourceIP, TargetIP string
	// Namespace is whether this agent holds the source pod's network namespace.
	Namespace bool
}

// DecideForward says whether the source pod forwards to the target pod, and to where; reason
// says why not.
func DecideForward(in HandoverInput) (f podnetwork.Forward, ok bool, reason string) {
	switch {
	case !in.Migrated:
		return f, false, "the guest did not leave"
	case !in.HasNet:
		return f, false, "the VM has no interface on the pod network"
	case in.Plan.Binding != podnetwork.Masquerade:
		return f, false, "only the masquerade binding forwards"
	case !in.Namespace:
		return f, false, "this agent does not hold the source pod's network namespace (it restarted since the pod started)"
	}
	target, err := netip.ParseAddr(in.TargetIP)
	if err != nil || !target.Is4() {
		return f, false, "the target pod has no IPv4 address in its status"
	}
	if in.SourceIP == in.TargetIP {
		return f, false, "the target pod has the source pod's address"
	}
	return podnetwork.Forward{Target: target, Ports: in.Plan.Ports}, true, ""
}

const (
	// ForwardAfterEndpoints is how long the source pod still forwards after no EndpointSlice
	// lists it: the time Service proxies take to follow, kube-proxy's default minSyncPeriod of
	// 1 s and a rewrite of its rules.
	ForwardAfterEndpoints = 2 * time.Second
	// ForwardAtMost bounds a forward whose source pod stays listed (a Service proxy that lists
	// pods some other way, an API server that does not answer).
	ForwardAtMost = time.Minute
	// forwardCheckInterval is how often the source agent reads the EndpointSlices while it
	// forwards.
	forwardCheckInterval = 250 * time.Millisecond
)

// SourceListed says whether any of slices lists the pod sourcePod (by UID) as an endpoint a
// Service proxy may still send to: ready, or serving while terminating.
func SourceListed(slices []discoveryv1.EndpointSlice, sourcePod string) bool {
	for _, s := range slices {
		for _, ep := range s.Endpoints {
			if ep.TargetRef == nil || string(ep.TargetRef.UID) != sourcePod {
				continue
			}
			ready := ep.Conditions.Ready == nil || *ep.Conditions.Ready
			serving := ep.Conditions.Serving != nil && *ep.Conditions.Serving
			if ready || serving {
				return true
			}
		}
	}
	return false
}

// ForwardEndInput is what the forward's end depends on, read every forwardCheckInterval.
type ForwardEndInput struct {
	Now, Started time.Time
	// LastListed is when the source pod was last seen listed (Started until then).
	LastListed time.Time
	// Listed says whether it is listed now; ReadFailed that the slices could not be read.
	Listed, ReadFailed bool
}

// DecideForwardEnd says whether the forward ends now, and why.
func DecideForwardEnd(in ForwardEndInput) (stop bool, reason string) {
	switch {
	case in.Now.Sub(in.Started) >= ForwardAtMost:
		return true, "forwarded for " + ForwardAtMost.String() + ", the longest a forward lasts"
	case in.ReadFailed, in.Listed:
		return false, ""
	case in.Now.Sub(in.LastListed) >= ForwardAfterEndpoints:
		return true, "no EndpointSlice has listed the source pod for " + ForwardAfterEndpoints.String()
	}
	return false, ""
}

// vmiPlan is the network plan of vmi's pod interface.
func vmiPlan(vmi *v1alpha1.VirtualMachineInstance, tapOwner uint32) (podnetwork.Plan, bool) {
	plan, ok, err := podnetwork.PlanFor(vmi, tapOwner)
	return plan, ok && err == nil
}

// handover is what the source agent read about a migration's pods before it started.
type handover struct {
	in        HandoverInput
	sourcePod string // UID
}

// prepareHandover reads the source and target pods' addresses before the migration starts,
// so that nothing but the forward itself is left for its end.
func (m *migrations) prepareHandover(ctx context.Context, mig *v1alpha1.VirtualMachineInstanceMigration, vmi *v1alpha1.VirtualMachineInstance) handover {
	var h handover
	h.in.Plan, h.in.HasNet = vmiPlan(vmi, contract.UID)
	get := m.a.cfg.GetPod
	if !h.in.HasNet || get == nil || vmi.Status.LauncherPod == nil {
		return h
	}
	h.sourcePod = string(vmi.Status.LauncherPod.UID)
	if pod, err := get(ctx, vmi.Namespace, vmi.Status.LauncherPod.Name); err == nil && pod.UID == vmi.Status.LauncherPod.UID {
		h.in.SourceIP = pod.Status.PodIP
	}
	if pod, err := get(ctx, vmi.Namespace, mig.Status.TargetPod); err == nil {
		h.in.TargetIP = pod.Status.PodIP
	}
	return h
}

// handOver makes the source pod forward to the target pod once the guest has left, and ends
// the forward in the background.
func (m *migrations) handOver(h handover, vmi *v1alpha1.VirtualMachineInstance, log *slog.Logger) {
	uid := string(vmi.UID)
	ns := m.a.takeNetns(uid)
	h.in.Migrated, h.in.Namespace = true, ns != nil
	f, ok, reason := DecideForward(h.in)
	if !ok {
		if ns != nil {
			ns.Close()
		}
		if h.in.HasNet {
			m.a.cfg.Metrics.SourceForwards.WithLabelValues("skipped").Inc()
			log.Info("the source pod does not forward to the target pod", "reason", reason)
		}
		return
	}
	if err := podnetwork.StartForward(ns, f); err != nil {
		ns.Close()
		m.a.cfg.Metrics.SourceForwards.WithLabelValues("failed").Inc()
		log.Error("making the source pod forward to the target pod", "err", err)
		return
	}
	m.a.cfg.Metrics.SourceForwards.WithLabelValues("started").Inc()
	log.Info(podnetwork.MsgForwarding, "target", f.Target.String(), "ports", len(f.Ports))
	go m.endForward(vmi.Namespace, h.sourcePod, ns, log)
}

// endForward removes the source pod's forward once DecideForwardEnd says so. An agent that
// restarts meanwhile leaves the rules, which go with the source pod's namespace.
func (m *migrations) endForward(namespace, sourcePod string, ns *os.File, log *slog.Logger) {
	defer ns.Close()
	clk := m.a.cfg.Clock
	in := ForwardEndInput{Started: clk.Now()}
	in.LastListed = in.Started
	for {
		in.Now = clk.Now()
		in.Listed, in.ReadFailed = false, m.a.cfg.EndpointSlices == nil
		if !in.ReadFailed {
			ctx, cancel := context.WithTimeout(context.Background(), forwardCheckInterval*4)
			slices, err := m.a.cfg.EndpointSlices(ctx, namespace)
			cancel()
			in.ReadFailed = err != nil
			in.Listed = err == nil && SourceListed(slices, sourcePod)
		}
		if in.Listed {
			in.LastListed = in.Now
		}
		if stop, reason := DecideForwardEnd(in); stop {
			if err := podnetwork.StopForward(ns); err != nil {
				log.Error("removing the source pod's forward to the target pod", "err", err)
				return
			}
			log.Info(podnetwork.MsgForwardEnded, "reason", reason, "after", clk.Since(in.Started).String())
			return
		}
		<-clk.After(forwardCheckInterval)
	}
}

// keepNetns keeps a copy of the network namespace descriptor a launcher sent, for the
// forward at the end of a migration away; it replaces the one kept before for the same VMI.
func (a *Agent) keepNetns(uid string, ns *os.File) error {
	fd, err := unix.FcntlInt(ns.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), "netns of "+uid)
	a.netnsMu.Lock()
	if a.netns == nil {
		a.netns = map[string]*os.File{}
	}
	old := a.netns[uid]
	a.netns[uid] = f
	a.netnsMu.Unlock()
	if old != nil {
		old.Close()
	}
	return nil
}

// takeNetns hands over the kept namespace of uid's launcher pod; nil if none is kept.
func (a *Agent) takeNetns(uid string) *os.File {
	a.netnsMu.Lock()
	defer a.netnsMu.Unlock()
	f := a.netns[uid]
	delete(a.netns, uid)
	return f
}

// dropNetns closes the kept namespace of uid's launcher pod.
func (a *Agent) dropNetns(uid string) {
	if f := a.takeNetns(uid); f != nil {
		f.Close()
	}
}
