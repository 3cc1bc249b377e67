package podnetwork

import (
	"bytes"
	"net"
	"net/netip"
	"testing"

	"github.com/google/nftables/expr"
)

// verdictOf runs rules over frame as the kernel's netdev ingress hook does, for the expressions
// FilterRules uses: whether the frame is accepted, and which counter a drop counts in. The
// integration test below checks the kernel agrees.
func verdictOf(t *testing.T, rules [][]expr.Any, frame []byte) (accepted bool, counter string) {
	t.Helper()
	for _, rule := range rules {
		var reg []byte
		counted := ""
	exprs:
		for _, e := range rule {
			switch e := e.(type) {
			case *expr.Payload:
				data, ok := headerOf(frame, e.Base)
				if !ok || int(e.Offset+e.Len) > len(data) {
					break exprs // the kernel breaks off a rule whose header is not there
				}
				reg = data[e.Offset : e.Offset+e.Len]
			case *expr.Cmp:
				if e.Op != expr.CmpOpEq && e.Op != expr.CmpOpNeq {
					t.Fatalf("comparison %v is not one verdictOf knows", e.Op)
				}
				if bytes.Equal(reg, e.Data) != (e.Op == expr.CmpOpEq) {
					break exprs
				}
			case *expr.Objref:
				counted = e.Name
			case *expr.Verdict:
				switch e.Kind {
				case expr.VerdictAccept:
					return true, counted
				case expr.VerdictDrop:
					return false, counted
				}
				t.Fatalf("verdict %v is not one verdictOf knows", e.Kind)
			default:
				t.Fatalf("expression %T is not one verdictOf knows", e)
			}
		}
	}
	return false, "" // the chain's policy
}

// headerOf is the frame from the start of the header base: the network header follows the
// Ethernet header, and a transport header only IPv4's.
func headerOf(frame []byte, base expr.PayloadBase) ([]byte, bool) {
	if len(frame) < 14 {
		return nil, false
	}
	switch base {
	case expr.PayloadBaseLLHeader:
		return frame, true
	case expr.PayloadBaseNetworkHeader:
		return frame[14:], true
	case expr.PayloadBaseTransportHeader:
		ip := frame[14:]
		if !bytes.Equal(frame[12:14], etherIPv4) || len(ip) < 20 || int(ip[0]&0x0f)*4 > len(ip) {
			return nil, false
		}
		return ip[int(ip[0]&0x0f)*4:], true
	}
	return nil, false
}

var (
	guestMAC   = net.HardwareAddr{0x02, 0xaa, 0xbb, 0xcc, 0xdd, 0x01}
	otherMAC   = net.HardwareAddr{0x02, 0xaa, 0xbb, 0xcc, 0xdd, 0x66}
	routerMAC  = net.HardwareAddr{0x02, 0x11, 0x22, 0x33, 0x44, 0x55}
	broadcast  = net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	guestIP    = netip.MustParseAddr("10.0.2.2")
	gatewayIP  = netip.MustParseAddr("10.0.2.1")
	neighbour  = netip.MustParseAddr("10.0.2.77")
	zeroIP     = netip.IPv4Unspecified()
	broadcast4 = netip.MustParseAddr("255.255.255.255")
)

func TestFilterRules(t *testing.T) {
	rules, err := FilterRules(GuestIdentity{MAC: guestMAC, Address: guestIP})
	if err != nil {
		t.Fatal(err)
	}
	badARP := arpRequest(guestMAC, guestIP, gatewayIP)
	badARP[4] = 8 // a hardware address of 8 bytes shifts the sender's address
	for _, tc := range []struct {
		name     string
		frame    []byte
		accepted bool
		counter  string
	}{
		{"IPv4 from the guest's MAC and address", ethernet(routerMAC, guestMAC, typeIPv4, udp4(guestIP, gatewayIP, 40000, 53, nil)), true, ""},
		{"IPv4 from another address", ethernet(routerMAC, guestMAC, typeIPv4, udp4(neighbour, gatewayIP, 40000, 53, nil)), false, SpoofedCounter},
		{"IPv4 from the guest's address and another MAC", ethernet(routerMAC, otherMAC, typeIPv4, udp4(guestIP, gatewayIP, 40000, 53, nil)), false, SpoofedCounter},
		{"a DHCP request before the lease", ethernet(broadcast, guestMAC, typeIPv4, udp4(zeroIP, broadcast4, 68, 67, nil)), true, ""},
		{"a DHCP request from another MAC", ethernet(broadcast, otherMAC, typeIPv4, udp4(zeroIP, broadcast4, 68, 67, nil)), false, SpoofedCounter},
		{"a DHCP request from 0.0.0.0 to one host", ethernet(routerMAC, guestMAC, typeIPv4, udp4(zeroIP, gatewayIP, 68, 67, nil)), false, SpoofedCounter},
		{"other UDP from 0.0.0.0", ethernet(broadcast, guestMAC, typeIPv4, udp4(zeroIP, broadcast4, 68, 53, nil)), false, SpoofedCounter},
		// The guest is a DHCP client only: its offers, acks and naks would reach other pods' clients.
		{"a DHCP offer from the guest's address", ethernet(broadcast, guestMAC, typeIPv4, udp4(guestIP, broadcast4, 67, 68, nil)), false, SpoofedCounter},
		{"a DHCP offer from 0.0.0.0", ethernet(broadcast, guestMAC, typeIPv4, udp4(zeroIP, broadcast4, 67, 68, nil)), false, SpoofedCounter},
		{"UDP from port 67 to another port", ethernet(routerMAC, guestMAC, typeIPv4, udp4(guestIP, gatewayIP, 67, 53, nil)), false, SpoofedCounter},
		{"UDP to port 67 from the guest's address (a renewal)", ethernet(routerMAC, guestMAC, typeIPv4, udp4(guestIP, gatewayIP, 68, 67, nil)), true, ""},
		{"IPv4 cut short", ethernet(routerMAC, guestMAC, typeIPv4, []byte{0x45, 0}), false, SpoofedCounter},
		{"ARP from the guest's MAC and address", ethernet(broadcast, guestMAC, typeARP, arpRequest(guestMAC, guestIP, gatewayIP)), true, ""},
		{"an ARP probe, claiming no address", ethernet(broadcast, guestMAC, typeARP, arpRequest(guestMAC, zeroIP, guestIP)), true, ""},
		{"ARP claiming the gateway's address", ethernet(broadcast, guestMAC, typeARP, arpRequest(guestMAC, gatewayIP, neighbour)), false, SpoofedCounter},
		{"ARP claiming another MAC for the guest's address", ethernet(broadcast, guestMAC, typeARP, arpRequest(otherMAC, guestIP, gatewayIP)), false, SpoofedCounter},
		{"ARP from another MAC", ethernet(broadcast, otherMAC, typeARP, arpRequest(otherMAC, neighbour, gatewayIP)), false, SpoofedCounter},
		{"ARP of another hardware layout", ethernet(broadcast, guestMAC, typeARP, badARP), false, SpoofedCounter},
		{"IPv6 from the guest's MAC", ethernet(broadcast, guestMAC, typeIPv6, ipv6Header(netip.MustParseAddr("fe80::1"))), false, UnsupportedCounter},
		{"a VLAN-tagged frame", ethernet(routerMAC, guestMAC, typeVLAN, vlanTagged(7, udp4(guestIP, gatewayIP, 40000, 53, nil))), false, UnsupportedCounter},
		{"a frame shorter than its Ethernet header", guestMAC, false, UnsupportedCounter},
	} {
		accepted, counter := verdictOf(t, rules, tc.frame)
		if accepted != tc.accepted || counter != tc.counter {
			t.Errorf("%s: accepted %v, counted in %q; want %v, %q", tc.name, accepted, counter, tc.accepted, tc.counter)
		}
	}
}

func TestFilterRulesNeedAnEthernetMACAndAnIPv4Address(t *testing.T) {
	for _, g := range []GuestIdentity{
		{MAC: guestMAC},
		{MAC: guestMAC, Address: netip.MustParseAddr("fd00::2")},
		{MAC: net.HardwareAddr{1, 2, 3}, Address: guestIP},
	} {
		if _, err := FilterRules(g); err == nil {
			t.Errorf("FilterRules(%s, %s) made rules; want an error, not a filter that lets nothing or anything through", g.MAC, g.Address)
		}
	}
}
