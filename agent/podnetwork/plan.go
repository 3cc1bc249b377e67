// Package podnetwork builds a VM's side of the pod network inside its launcher pod's network
// namespace: a bridge, the tap QEMU opens, and for the masquerade binding the NAT between the
// pod's address and the guest's fixed private one; for both bindings, a filter on the tap that
// lets the guest send only from its own MAC and address (guestfilter.go). The agent does this, as KubeVirt's
// virt-handler does, because it needs CAP_NET_ADMIN in the pod's namespace and the launcher has
// no capability at all; the launcher then serves DHCP to the guest on the bridge (the lease
// says what to offer) and points QEMU at the tap.
package podnetwork

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

// Names and addresses inside every launcher pod's network namespace.
const (
	// PodInterface is the pod's interface, the one its CNI plugin made.
	PodInterface = "eth0"
	// Bridge joins the tap to the guest's gateway (masquerade) or to eth0 (bridge binding).
	Bridge = "lb-br0"
	// Tap is the device QEMU opens (libvirt's unmanaged ethernet interface).
	Tap = "lb-tap0"
)

var (
	// BridgeMAC is the bridge's address, the same in every pod (a locally administered one
	// that only the pod's guest sees): the guest's gateway keeps its hardware address through a
	// migration, so the guest's ARP cache holds for the target's bridge, and its first answers
	// there are not sent to the source's.
	BridgeMAC = net.HardwareAddr{0x02, 0x6c, 0x62, 0x00, 0x00, 0x01}
	// GuestPrefix is the guest's address behind masquerade, the same in every pod and on both
	// sides of a migration, so the guest never sees its address change.
	GuestPrefix = netip.MustParsePrefix("10.0.2.2/24")
	// GatewayPrefix is the bridge's address behind masquerade: the guest's gateway, DNS
	// forwarder's address, and DHCP server.
	GatewayPrefix = netip.MustParsePrefix("10.0.2.1/24")
	// BridgeBindingServer is the bridge's address with the bridge binding, where eth0's
	// address went to the guest: a link-local address the DHCP server answers from.
	BridgeBindingServer = netip.MustParsePrefix("169.254.75.10/32")
)

// Binding is how the guest's card reaches the pod network.
type Binding string

const (
	Masquerade Binding = "masquerade"
	BridgeMode Binding = "bridge"
)

// PortRule is a port the pod forwards to the guest behind masquerade.
type PortRule struct {
	// Protocol is "TCP" or "UDP".
	Protocol string
	Port     uint16
}

// Plan is what to build in one pod for the VMI's interface on the pod network.
type Plan struct {
	Binding Binding
	// Ports are forwarded to the guest; none means every port (masquerade only).
	Ports []PortRule
	// TapOwner is the user (and group) the tap belongs to: the launcher's, so that its QEMU
	// may open it without any capability.
	TapOwner uint32
	// GuestMAC is the guest's card's address behind masquerade, the only source MAC the pod
	// lets through from it. The bridge binding leaves it unset: its guest takes eth0's own
	// MAC, which only the pod's namespace knows (see bridge).
	GuestMAC net.HardwareAddr
}

// PlanFor is the plan for vmi's interface on the pod network; ok is false when it has none.
// The API admits at most one such interface with exactly one binding; PlanFor refuses anything
// else that reaches it (a VMI stored before those rules).
func PlanFor(vmi *v1alpha1.VirtualMachineInstance, tapOwner uint32) (plan Plan, ok bool, err error) {
	iface, ok, err := v1alpha1.PodInterface(&vmi.Spec)
	if !ok || err != nil {
		return Plan{}, ok, err
	}
	plan = Plan{TapOwner: tapOwner}
	switch {
	case iface.Masquerade != nil && iface.Bridge == nil:
		plan.Binding = Masquerade
		mac, err := iface.MAC(string(vmi.UID))
		if err != nil {
			return Plan{}, true, fmt.Errorf("interface %q: %w", iface.Name, err)
		}
		plan.GuestMAC = mac
	case iface.Bridge != nil && iface.Masquerade == nil:
		plan.Binding = BridgeMode
		if len(iface.Ports) > 0 {
			return Plan{}, true, fmt.Errorf("interface %q: ports are for the masquerade binding", iface.Name)
		}
		if iface.MACAddress != "" {
			return Plan{}, true, fmt.Errorf("interface %q: macAddress is for the masquerade binding", iface.Name)
		}
	default:
		return Plan{}, true, fmt.Errorf("interface %q needs exactly one binding: masquerade or bridge", iface.Name)
	}
	for _, p := range iface.Ports {
		proto := string(p.Protocol)
		if proto == "" {
			proto = "TCP"
		}
		if proto != "TCP" && proto != "UDP" {
			return Plan{}, true, fmt.Errorf("interface %q: port %d: protocol %q is not TCP or UDP", iface.Name, p.Port, p.Protocol)
		}
		if p.Port < 1 || p.Port > 65535 {
			return Plan{}, true, fmt.Errorf("interface %q: port %d is out of range 1-65535", iface.Name, p.Port)
		}
		plan.Ports = append(plan.Ports, PortRule{Protocol: proto, Port: uint16(p.Port)})
	}
	return plan, true, nil
}
