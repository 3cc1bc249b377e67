package agent

import (
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/lifeboat-vm/lifeboat/agent/podnetwork"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/api/notify"
	"github.com/lifeboat-vm/lifeboat/domain"
)

func TestDecideForward(t *testing.T) {
	masq := podnetwork.Plan{Binding: podnetwork.Masquerade, Ports: []podnetwork.PortRule{{Protocol: "TCP", Port: 8080}}}
	ready := HandoverInput{Leaving: true, Plan: masq, HasNet: true, SourceIP: "10.244.1.5", TargetIP: "10.244.2.7", Namespace: true}
	with := func(f func(*HandoverInput)) HandoverInput { in := ready; f(&in); return in }
	for _, tc := range []struct {
		name   string
		in     HandoverInput
		want   bool
		reason string
	}{
		{"the guest left a masquerade pod: forward to the target", ready, true, ""},
		{"the migration has not reached its switch-over", with(func(in *HandoverInput) { in.Leaving = false }), false, "the guest is not leaving"},
		{"no pod network", with(func(in *HandoverInput) { in.HasNet = false }), false, "the VM has no interface on the pod network"},
		{"bridge binding", with(func(in *HandoverInput) { in.Plan.Binding = podnetwork.BridgeMode }), false, "only the masquerade binding forwards"},
		{"an agent restarted since the pod's network was built", with(func(in *HandoverInput) { in.Namespace = false }), false,
			"this agent does not hold the source pod's network namespace (it restarted since the pod started)"},
		{"the target's address unknown", with(func(in *HandoverInput) { in.TargetIP = "" }), false, "the target pod has no IPv4 address in its status"},
		{"an IPv6 target", with(func(in *HandoverInput) { in.TargetIP = "fd00::7" }), false, "the target pod has no IPv4 address in its status"},
		{"the target has the source's address", with(func(in *HandoverInput) { in.TargetIP = in.SourceIP }), false, "the target pod has the source pod's address"},
		{"the source's address unknown does not matter", with(func(in *HandoverInput) { in.SourceIP = "" }), true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, ok, reason := DecideForward(tc.in)
			if ok != tc.want || reason != tc.reason {
				t.Fatalf("DecideForward = %t %q, want %t %q", ok, reason, tc.want, tc.reason)
			}
			if ok && (f.Target != netip.MustParseAddr(tc.in.TargetIP) || len(f.Ports) != len(tc.in.Plan.Ports)) {
				t.Errorf("forward = %+v, want to %s with the plan's ports", f, tc.in.TargetIP)
			}
		})
	}
}

func TestSourceListed(t *testing.T) {
	ep := func(uid string, ready, serving *bool) discoveryv1.Endpoint {
		return discoveryv1.Endpoint{TargetRef: &corev1.ObjectReference{Kind: "Pod", UID: types.UID(uid)},
			Conditions: discoveryv1.EndpointConditions{Ready: ready, Serving: serving, Terminating: ptr.To(ready != nil && !*ready && serving != nil && *serving)}}
	}
	slice := func(eps ...discoveryv1.Endpoint) discoveryv1.EndpointSlice {
		return discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{discoveryv1.LabelServiceName: "vm"}}, Endpoints: eps}
	}
	of := func(service string, s discoveryv1.EndpointSlice) discoveryv1.EndpointSlice {
		s.Labels = map[string]string{discoveryv1.LabelServiceName: service}
		return s
	}
	for _, tc := range []struct {
		name   string
		slices []discoveryv1.EndpointSlice
		want   bool
	}{
		{"ready", []discoveryv1.EndpointSlice{slice(ep("target", ptr.To(true), nil)), slice(ep("source", ptr.To(true), nil))}, true},
		{"ready unknown reads as ready", []discoveryv1.EndpointSlice{slice(ep("source", nil, nil))}, true},
		{"terminating but serving, the only endpoint: proxies fall back to it", []discoveryv1.EndpointSlice{slice(ep("source", ptr.To(false), ptr.To(true)))}, true},
		{"terminating but serving, the target not ready yet", []discoveryv1.EndpointSlice{slice(ep("source", ptr.To(false), ptr.To(true)), ep("target", ptr.To(false), ptr.To(false)))}, true},
		{"terminating but serving, the target ready: proxies send there", []discoveryv1.EndpointSlice{slice(ep("source", ptr.To(false), ptr.To(true)), ep("target", ptr.To(true), ptr.To(true)))}, false},
		{"terminating but serving, the target ready in another slice of the Service", []discoveryv1.EndpointSlice{slice(ep("source", ptr.To(false), ptr.To(true))), slice(ep("target", ptr.To(true), ptr.To(true)))}, false},
		{"terminating but serving, a ready endpoint only in another Service", []discoveryv1.EndpointSlice{slice(ep("source", ptr.To(false), ptr.To(true))), of("other", slice(ep("target", ptr.To(true), ptr.To(true))))}, true},
		{"not ready", []discoveryv1.EndpointSlice{slice(ep("source", ptr.To(false), ptr.To(false)), ep("target", ptr.To(true), nil))}, false},
		{"gone from the slices", []discoveryv1.EndpointSlice{slice(ep("target", ptr.To(true), nil))}, false},
		{"no slices", nil, false},
		{"an endpoint that is no pod", []discoveryv1.EndpointSlice{slice(discoveryv1.Endpoint{Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}})}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := SourceListed(tc.slices, "source"); got != tc.want {
				t.Errorf("SourceListed = %t, want %t", got, tc.want)
			}
		})
	}
}

func TestDecideForwardEnd(t *testing.T) {
	start := time.Date(2026, 11, 28, 6, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return start.Add(d) }
	for _, tc := range []struct {
		name   string
		in     ForwardEndInput
		stop   bool
		reason string
	}{
		{"still listed", ForwardEndInput{Now: at(5 * time.Second), Started: start, LastListed: at(5 * time.Second), Listed: true}, false, ""},
		{"unlisted, the proxies still following", ForwardEndInput{Now: at(2500 * time.Millisecond), Started: start, LastListed: at(time.Second)}, false, ""},
		{"unlisted long enough", ForwardEndInput{Now: at(3 * time.Second), Started: start, LastListed: at(time.Second)}, true,
			"no EndpointSlice has listed the source pod for 2s"},
		{"never listed: from the start", ForwardEndInput{Now: at(2 * time.Second), Started: start, LastListed: start}, true,
			"no EndpointSlice has listed the source pod for 2s"},
		{"the slices unreadable: keep forwarding", ForwardEndInput{Now: at(10 * time.Second), Started: start, LastListed: start, ReadFailed: true}, false, ""},
		{"at most a minute, listed or not", ForwardEndInput{Now: at(time.Minute), Started: start, LastListed: at(time.Minute), Listed: true}, true,
			"forwarded for 1m0s, the longest a forward lasts"},
		{"at most a minute, unreadable", ForwardEndInput{Now: at(time.Minute), Started: start, LastListed: start, ReadFailed: true}, true,
			"forwarded for 1m0s, the longest a forward lasts"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stop, reason := DecideForwardEnd(tc.in)
			if stop != tc.stop || reason != tc.reason {
				t.Errorf("DecideForwardEnd = %t %q, want %t %q", stop, reason, tc.stop, tc.reason)
			}
		})
	}
}

func TestSwitchOverBegan(t *testing.T) {
	for _, tc := range []struct {
		ev   domain.Event
		want bool
	}{
		{domain.Event{Type: domain.EventSuspended, Reason: domain.ReasonMigration}, true},
		{domain.Event{Type: domain.EventSuspended, Reason: domain.ReasonUser}, false},
		{domain.Event{Type: domain.EventSuspended, Reason: domain.ReasonPostcopy}, false},
		{domain.Event{Type: domain.EventStopped, Reason: domain.ReasonMigrated}, false},
		{domain.Event{Type: domain.EventResumed, Reason: domain.ReasonMigrated}, false},
	} {
		if got := SwitchOverBegan(tc.ev); got != tc.want {
			t.Errorf("SwitchOverBegan(%s %s) = %t, want %t", tc.ev.Type, tc.ev.Reason, got, tc.want)
		}
	}
}

// A source launcher waits for HandoverDone longer than the agent forwards: only a lost agent
// leaves it waiting its whole bound.
func TestALauncherWaitsLongerThanItsPodForwards(t *testing.T) {
	if longest := ForwardAtMost + 4*forwardCheckInterval; notify.HandoverAtMost <= longest {
		t.Errorf("a launcher waits at most %s for HandoverDone, but its pod may forward for %s", notify.HandoverAtMost, longest)
	}
}

// The source agent tells a launcher whose guest left that its pod is no longer needed: once its
// forward ends if it holds the migration's handover, at once if it does not (it restarted
// since, and the launcher's reports came again on a new connection).
func TestTheSourceLauncherIsToldWhenItsPodIsNoLongerNeeded(t *testing.T) {
	told := make(chan *notify.Message, 4)
	a := newFakeAgent(t, Config{TellLauncher: func(uid string, m *notify.Message) bool {
		if uid != m.VMI.UID {
			t.Errorf("told the launcher of %s a message for %s", uid, m.VMI)
		}
		told <- m
		return true
	}})
	ref := notify.VMIRef{Namespace: "ns", Name: "vm", UID: "uid-vm"}
	gone := &notify.Message{Kind: notify.KindDomainGone, Reason: notify.ReasonMigrated, VMI: ref, Time: time.Now()}
	next := func(what string) *notify.Message {
		t.Helper()
		select {
		case m := <-told:
			if m.Kind != notify.KindHandoverDone || m.VMI != ref {
				t.Fatalf("told %s for %s, want HandoverDone for %s", m.Kind, m.VMI, ref)
			}
			return m
		case <-time.After(10 * time.Second):
			t.Fatalf("the launcher was not told, %s", what)
		}
		return nil
	}

	a.HandleNotify(gone, 1)
	next("though this agent holds no forward for its pod")

	// This agent runs the migration: the launcher's report of its guest's departure waits for
	// the forward's end.
	a.handovers.Store(ref.UID, struct{}{})
	a.HandleNotify(gone, 1)
	select {
	case m := <-told:
		t.Fatalf("told %s while the migration's handover was held", m.Kind)
	case <-time.After(300 * time.Millisecond):
	}
	vmi := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: ref.Namespace, Name: ref.Name, UID: types.UID(ref.UID)}}
	a.migrations.releaseSource(vmi, "the source pod's forward ended")
	if m := next("when its forward ended"); m.Reason != "the source pod's forward ended" {
		t.Errorf("told with reason %q", m.Reason)
	}
	if _, held := a.handovers.Load(ref.UID); held {
		t.Error("the handover is still held after the launcher was told")
	}
}
