package podnetwork

import (
	"slices"
	"strings"
	"testing"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

func TestPlanFor(t *testing.T) {
	pod := []v1alpha1.Network{{Name: "default", Pod: &v1alpha1.PodNetwork{}}}
	masq := &v1alpha1.InterfaceMasquerade{}
	for _, tc := range []struct {
		name   string
		spec   v1alpha1.VirtualMachineInstanceSpec
		ok     bool
		want   Plan
		errHas string
	}{
		{name: "no interface: nothing to build"},
		{name: "masquerade forwarding every port", ok: true,
			spec: v1alpha1.VirtualMachineInstanceSpec{Interfaces: []v1alpha1.Interface{{Name: "default", Masquerade: masq}}, Networks: pod},
			want: Plan{Binding: Masquerade, TapOwner: 107}},
		{name: "masquerade forwarding two ports, TCP by default", ok: true,
			spec: v1alpha1.VirtualMachineInstanceSpec{Interfaces: []v1alpha1.Interface{{Name: "default", Masquerade: masq,
				Ports: []v1alpha1.Port{{Port: 80}, {Port: 53, Protocol: "UDP"}}}}, Networks: pod},
			want: Plan{Binding: Masquerade, TapOwner: 107, Ports: []PortRule{{"TCP", 80}, {"UDP", 53}}}},
		{name: "bridge", ok: true,
			spec: v1alpha1.VirtualMachineInstanceSpec{Interfaces: []v1alpha1.Interface{{Name: "default", Bridge: &v1alpha1.InterfaceBridge{}}}, Networks: pod},
			want: Plan{Binding: BridgeMode, TapOwner: 107}},
		{name: "masquerade with the spec's MAC", ok: true,
			spec: v1alpha1.VirtualMachineInstanceSpec{Interfaces: []v1alpha1.Interface{{Name: "default", Masquerade: masq, MACAddress: "52:54:00:12:34:56"}}, Networks: pod},
			want: Plan{Binding: Masquerade, TapOwner: 107}},
		// On a shared bridge, a MAC of the tenant's choice could be a neighbour pod's.
		{name: "bridge with the spec's MAC", ok: true, errHas: "macAddress is for the masquerade binding",
			spec: v1alpha1.VirtualMachineInstanceSpec{Interfaces: []v1alpha1.Interface{{Name: "default", Bridge: &v1alpha1.InterfaceBridge{}, MACAddress: "52:54:00:12:34:56"}}, Networks: pod}},
		{name: "an interface on an unknown network", ok: true, errHas: `interface "default" names no network`,
			spec: v1alpha1.VirtualMachineInstanceSpec{Interfaces: []v1alpha1.Interface{{Name: "default", Masquerade: masq}}}},
		{name: "two interfaces on the pod network", ok: true, errHas: "a VM has at most one",
			spec: v1alpha1.VirtualMachineInstanceSpec{Interfaces: []v1alpha1.Interface{{Name: "a", Masquerade: masq}, {Name: "b", Masquerade: masq}},
				Networks: []v1alpha1.Network{{Name: "a", Pod: &v1alpha1.PodNetwork{}}, {Name: "b", Pod: &v1alpha1.PodNetwork{}}}}},
		{name: "two bindings", ok: true, errHas: "exactly one binding",
			spec: v1alpha1.VirtualMachineInstanceSpec{Interfaces: []v1alpha1.Interface{{Name: "default", Masquerade: masq, Bridge: &v1alpha1.InterfaceBridge{}}}, Networks: pod}},
		{name: "a port out of range", ok: true, errHas: "port 70000 is out of range",
			spec: v1alpha1.VirtualMachineInstanceSpec{Interfaces: []v1alpha1.Interface{{Name: "default", Masquerade: masq, Ports: []v1alpha1.Port{{Port: 70000}}}}, Networks: pod}},
	} {
		vmi := &v1alpha1.VirtualMachineInstance{Spec: tc.spec}
		vmi.UID = "uid-1"
		plan, ok, err := PlanFor(vmi, 107)
		switch {
		case ok != tc.ok:
			t.Errorf("%s: ok = %v, want %v", tc.name, ok, tc.ok)
		case tc.errHas != "" && (err == nil || !strings.Contains(err.Error(), tc.errHas)):
			t.Errorf("%s: error %v, want one saying %q", tc.name, err, tc.errHas)
		case tc.errHas == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.errHas == "" && (plan.Binding != tc.want.Binding || plan.TapOwner != tc.want.TapOwner || !equalPorts(plan.Ports, tc.want.Ports)):
			t.Errorf("%s: plan %+v, want %+v", tc.name, plan, tc.want)
		case ok && tc.errHas == "" && plan.GuestMAC.String() != wantMAC(vmi, plan.Binding):
			t.Errorf("%s: the filter lets through MAC %s, want %q", tc.name, plan.GuestMAC, wantMAC(vmi, plan.Binding))
		}
	}
}

// wantMAC is the MAC of vmi's only interface, the card QEMU gives the guest, behind masquerade;
// the bridge binding's is eth0's, which the plan cannot know.
func wantMAC(vmi *v1alpha1.VirtualMachineInstance, b Binding) string {
	if b == BridgeMode {
		return ""
	}
	mac, _ := vmi.Spec.Interfaces[0].MAC(string(vmi.UID))
	return mac.String()
}

func equalPorts(a, b []PortRule) bool { return slices.Equal(a, b) }

func TestMACIsTheSpecsOrDerivedFromTheUID(t *testing.T) {
	iface := v1alpha1.Interface{Name: "default"}
	a, _ := iface.MAC("uid-1")
	again, _ := iface.MAC("uid-1")
	other, _ := iface.MAC("uid-2")
	if a.String() != again.String() || a.String() == other.String() || a[0] != 0x02 {
		t.Errorf("derived MACs %s, %s, %s: want the same for one VMI, another for another, locally administered unicast (02:...)", a, again, other)
	}
	iface.MACAddress = "52:54:00:12:34:56"
	if m, err := iface.MAC("uid-1"); err != nil || m.String() != "52:54:00:12:34:56" {
		t.Errorf("MAC with macAddress set = %s, %v; want the spec's", m, err)
	}
}
