package agent

import (
	"context"
	"log/slog"
	"net/netip"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/lifeboat-vm/lifeboat/agent/podnetwork"
	contract "github.com/lifeboat-vm/lifeboat/api/launcher"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/api/notify"
	"github.com/lifeboat-vm/lifeboat/domain"
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
	// Leaving says the guest paused on this node for the migration's switch-over, or left.
	Leaving bool
	// Plan is the source pod's network plan; ok false if the VMI has no pod interface.
	Plan   podnetwork.Plan
	HasNet bool
	// SourceIP and TargetIP are the pods' addresses as their status says.
	SourceIP, TargetIP string
	// Namespace is whether this agent holds the source pod's network namespace.
	Namespace bool
}

// DecideForward says whether the source pod forwards to the target pod, and to where; reason
// says why not. It forwards from the switch-over's start: what reaches the target pod then
// waits in its tap, which its QEMU reads once the guest runs there, where the source's would
// be lost with the source's QEMU.
func DecideForward(in HandoverInput) (f podnetwork.Forward, ok bool, reason string) {
	switch {
	case !in.Leaving:
		return f, false, "the guest is not leaving"
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
// Service proxy may still send to: ready, or serving while terminating when its Service has no
// ready endpoint (proxies fall back to such endpoints only then; a source pod lifeboat deleted
// because its kubelet kept it Ready is one while the target is ready).
func SourceListed(slices []discoveryv1.EndpointSlice, sourcePod string) bool {
	hasReady := map[string]bool{}
	for _, s := range slices {
		for _, ep := range s.Endpoints {
			if endpointReady(ep) {
				hasReady[s.Labels[discoveryv1.LabelServiceName]] = true
			}
		}
	}
	for _, s := range slices {
		for _, ep := range s.Endpoints {
			if ep.TargetRef == nil || string(ep.TargetRef.UID) != sourcePod {
				continue
			}
			serving := ep.Conditions.Serving != nil && *ep.Conditions.Serving
			if endpointReady(ep) || serving && !hasReady[s.Labels[discoveryv1.LabelServiceName]] {
				return true
			}
		}
	}
	return false
}

// endpointReady is an endpoint's ready condition; unknown reads as ready, as the API says.
func endpointReady(ep discoveryv1.Endpoint) bool {
	return ep.Conditions.Ready == nil || *ep.Conditions.Ready
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

// SwitchOverBegan says whether ev is a domain pausing for its migration's switch-over: the
// moment the source pod's forward starts.
func SwitchOverBegan(ev domain.Event) bool {
	return ev.Type == domain.EventSuspended && ev.Reason == domain.ReasonMigration
}

// switchOverer is a libvirt connection that says when its guest pauses for a switch-over.
type switchOverer interface {
	SwitchOvers() <-chan struct{}
}

// forwarder is one migration's forward on the source: started at the switch-over's start or at
// the migration's end, whichever comes first; undone if the migration then fails.
type forwarder struct {
	m   *migrations
	h   handover
	vmi *v1alpha1.VirtualMachineInstance
	log *slog.Logger

	mu      sync.Mutex
	started bool
	ns      *os.File
}

// watchSwitchOver starts the forward when the guest pauses for its switch-over, until stop is
// closed; done is closed when it no longer watches.
func (f *forwarder) watchSwitchOver(stop <-chan struct{}) (done <-chan struct{}) {
	d := make(chan struct{})
	pauses := f.m.a.switchOvers(string(f.vmi.UID))
	// A pause left from an earlier attempt on the same connection is not this one's.
	for drained := false; pauses != nil && !drained; {
		select {
		case <-pauses:
		default:
			drained = true
		}
	}
	go func() {
		defer close(d)
		select {
		case <-pauses:
			f.start("the guest paused for the switch-over")
		case <-stop:
		}
	}()
	return d
}

// start makes the source pod forward to the target pod, once.
func (f *forwarder) start(why string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.started {
		return
	}
	f.started = true
	uid := string(f.vmi.UID)
	ns := f.m.a.takeNetns(uid)
	in := f.h.in
	in.Leaving, in.Namespace = true, ns != nil
	fw, ok, reason := DecideForward(in)
	if !ok {
		if ns != nil {
			f.m.a.putNetns(uid, ns)
		}
		if in.HasNet {
			f.m.a.cfg.Metrics.SourceForwards.WithLabelValues("skipped").Inc()
			f.log.Info("the source pod does not forward to the target pod", "reason", reason)
		}
		return
	}
	if err := podnetwork.StartForward(ns, fw); err != nil {
		f.m.a.putNetns(uid, ns)
		f.m.a.cfg.Metrics.SourceForwards.WithLabelValues("failed").Inc()
		f.log.Error("making the source pod forward to the target pod", "err", err)
		return
	}
	f.ns = ns
	f.m.a.cfg.Metrics.SourceForwards.WithLabelValues("started").Inc()
	f.log.Info(podnetwork.MsgForwarding, "when", why, "target", fw.Target.String(), "ports", len(fw.Ports))
}

// finish ends the forward: in the background once no EndpointSlice lists the source pod if the
// guest left, at once if it stays.
func (f *forwarder) finish(left bool) {
	if left {
		f.start("the migration ended")
	}
	f.mu.Lock()
	ns := f.ns
	f.ns = nil
	f.mu.Unlock()
	if ns == nil {
		if left {
			f.m.releaseSource(f.vmi, "the source pod did not forward")
		}
		return
	}
	if left {
		go func() {
			f.m.endForward(f.vmi.Namespace, f.h.sourcePod, ns, f.log)
			f.m.releaseSource(f.vmi, "the source pod's forward ended")
		}()
		return
	}
	if err := podnetwork.StopForward(ns); err != nil {
		ns.Close()
		f.log.Error("removing the source pod's forward to the target pod after the migration failed", "err", err)
		return
	}
	f.log.Info(podnetwork.MsgForwardEnded, "reason", "the migration call failed: the guest may stay")
	f.m.a.putNetns(string(f.vmi.UID), ns)
}

// undo removes the forward at once, when the migration call failed: the guest most likely runs
// on here again, and finish(true) starts the forward anew if it turns out to have left.
func (f *forwarder) undo() {
	f.finish(false)
	f.mu.Lock()
	f.started = false
	f.mu.Unlock()
}

// endForward removes the source pod's forward once DecideForwardEnd says so. An agent that
// restarts meanwhile leaves the rules, which go with the source pod's namespace.
func (m *migrations) endForward(namespace, sourcePod string, ns *os.File, log *slog.Logger) {
	defer ns.Close()
	clk := m.a.cfg.Clock
	in := ForwardEndInput{Started: clk.Now()}
	in.LastListed = in.Started
	for {
		in.Listed, in.ReadFailed = false, m.a.cfg.EndpointSlices == nil
		if !in.ReadFailed {
			ctx, cancel := context.WithTimeout(context.Background(), forwardCheckInterval*4)
			slices, err := m.a.cfg.EndpointSlices(ctx, namespace)
			cancel()
			in.ReadFailed = err != nil
			in.Listed = err == nil && SourceListed(slices, sourcePod)
		}
		// After the read: a slow answer must not date the source's last listing too early.
		in.Now = clk.Now()
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

// releaseSource tells the source launcher whose guest left that its pod is no longer needed:
// it has kept the pod, and the forward in its network namespace, until now.
func (m *migrations) releaseSource(vmi *v1alpha1.VirtualMachineInstance, why string) {
	m.a.handovers.Delete(string(vmi.UID))
	m.a.tellHandoverDone(notify.VMIRef{Namespace: vmi.Namespace, Name: vmi.Name, UID: string(vmi.UID)}, why)
}

// tellHandoverDone sends notify.KindHandoverDone to the launcher of ref.
func (a *Agent) tellHandoverDone(ref notify.VMIRef, why string) {
	tell := a.cfg.TellLauncher
	if tell == nil {
		return
	}
	log := a.cfg.Log.With("vmi", ref.String())
	if !tell(ref.UID, &notify.Message{Kind: notify.KindHandoverDone, Time: a.cfg.Clock.Now(), Reason: why, VMI: ref}) {
		log.Info("the source launcher was not connected to hear that its pod is no longer needed; it ends by itself", "within", notify.HandoverAtMost.String())
		return
	}
	log.Info("told the source launcher its pod is no longer needed", "reason", why)
}

// keepNetns keeps a copy of the network namespace descriptor a launcher sent, for the
// forward at the end of a migration away; it replaces the one kept before for the same VMI.
func (a *Agent) keepNetns(uid string, ns *os.File) error {
	f, err := dupFile(ns, "netns of "+uid)
	if err != nil {
		return err
	}
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

// putNetns gives back the namespace of uid's launcher pod taken for a forward that did not
// last (the guest stayed), unless another was kept since.
func (a *Agent) putNetns(uid string, ns *os.File) {
	a.netnsMu.Lock()
	if a.netns == nil {
		a.netns = map[string]*os.File{}
	}
	_, kept := a.netns[uid]
	if !kept {
		a.netns[uid] = ns
	}
	a.netnsMu.Unlock()
	if kept {
		ns.Close()
	}
}

// dropNetns closes the kept namespace of uid's launcher pod.
func (a *Agent) dropNetns(uid string) {
	if f := a.takeNetns(uid); f != nil {
		f.Close()
	}
}

// dupFile is a descriptor of its own for what f refers to, closed on exec, which outlives f.
func dupFile(f *os.File, name string) (*os.File, error) {
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), name), nil
}
