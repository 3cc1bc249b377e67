package launcher

import (
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/insomniacslk/dhcp/dhcpv4"

	"github.com/lifeboat-vm/lifeboat/api/notify"
)

func TestOfferForTakesTheLeaseAndThePodsResolver(t *testing.T) {
	lease := &notify.Lease{Interface: "lb-br0", Tap: "lb-tap0", Address: "10.0.2.2/24", Gateway: "10.0.2.1", Server: "10.0.2.1", MTU: 1450, MAC: "02:01:02:03:04:05"}
	resolv := "# kubelet\nsearch ns.svc.cluster.local svc.cluster.local\nnameserver 10.96.0.10\nnameserver 127.0.0.53\noptions ndots:5\n"
	o, err := OfferFor(lease, []byte(resolv))
	if err != nil {
		t.Fatal(err)
	}
	if o.Address.String() != "10.0.2.2/24" || o.Gateway.String() != "10.0.2.1" || o.MTU != 1450 || o.MAC.String() != "02:01:02:03:04:05" {
		t.Errorf("offer %+v: want the lease's address, gateway, MTU and MAC", o)
	}
	if !slices.Equal(o.DNS, []netip.Addr{netip.MustParseAddr("10.96.0.10")}) || strings.Join(o.Search, " ") != "ns.svc.cluster.local svc.cluster.local" {
		t.Errorf("DNS %v search %v: want the pod's name server (not its loopback one) and search list", o.DNS, o.Search)
	}
	for _, bad := range []notify.Lease{
		{Address: "10.0.2.2", Gateway: "10.0.2.1", Server: "10.0.2.1", MTU: 1500, MAC: "02:01:02:03:04:05"},
		{Address: "fd00::2/64", Gateway: "10.0.2.1", Server: "10.0.2.1", MTU: 1500, MAC: "02:01:02:03:04:05"},
		{Address: "10.0.2.2/24", Gateway: "gateway", Server: "10.0.2.1", MTU: 1500, MAC: "02:01:02:03:04:05"},
		{Address: "10.0.2.2/24", Gateway: "10.0.2.1", Server: "10.0.2.1", MTU: 100, MAC: "02:01:02:03:04:05"},
		{Address: "10.0.2.2/24", Gateway: "10.0.2.1", Server: "10.0.2.1", MTU: 1500},
	} {
		if _, err := OfferFor(&bad, nil); err == nil {
			t.Errorf("OfferFor(%+v) accepted a lease it cannot offer", bad)
		}
	}
}

func TestReply(t *testing.T) {
	mac := net.HardwareAddr{0x02, 1, 2, 3, 4, 5}
	o := Offer{MAC: mac, Address: netip.MustParsePrefix("10.0.2.2/24"), Gateway: netip.MustParseAddr("10.0.2.1"), Server: netip.MustParseAddr("10.0.2.1"),
		MTU: 1450, DNS: []netip.Addr{netip.MustParseAddr("10.96.0.10")}, Search: []string{"svc.cluster.local"}}
	neighbour := net.HardwareAddr{0x0a, 0x58, 0x0a, 0xf4, 0x09, 0x07}
	request := func(kind dhcpv4.MessageType, mods ...dhcpv4.Modifier) *dhcpv4.DHCPv4 {
		m, err := dhcpv4.New(append([]dhcpv4.Modifier{dhcpv4.WithMessageType(kind), dhcpv4.WithHwAddr(mac)}, mods...)...)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	for _, tc := range []struct {
		name string
		req  *dhcpv4.DHCPv4
		want dhcpv4.MessageType // MessageTypeNone: no answer
	}{
		{"a discover gets the offer", request(dhcpv4.MessageTypeDiscover), dhcpv4.MessageTypeOffer},
		{"a request for the offered address gets the ack", request(dhcpv4.MessageTypeRequest, dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(net.IPv4(10, 0, 2, 2)))), dhcpv4.MessageTypeAck},
		{"a renewal from the address gets the ack (after a migration too)", request(dhcpv4.MessageTypeRequest, dhcpv4.WithClientIP(net.IPv4(10, 0, 2, 2))), dhcpv4.MessageTypeAck},
		{"a request for another address gets a nak", request(dhcpv4.MessageTypeRequest, dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(net.IPv4(10, 0, 2, 9)))), dhcpv4.MessageTypeNak},
		{"a release gets nothing", request(dhcpv4.MessageTypeRelease), dhcpv4.MessageTypeNone},
		// With the bridge binding the server hears other pods' clients through eth0.
		{"another MAC's discover gets nothing", request(dhcpv4.MessageTypeDiscover, dhcpv4.WithHwAddr(neighbour)), dhcpv4.MessageTypeNone},
		{"another MAC's request gets nothing, not a nak", request(dhcpv4.MessageTypeRequest, dhcpv4.WithHwAddr(neighbour),
			dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(net.IPv4(10, 244, 9, 7)))), dhcpv4.MessageTypeNone},
	} {
		reply, err := o.Reply(tc.req)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if tc.want == dhcpv4.MessageTypeNone {
			if reply != nil {
				t.Errorf("%s: answered %s", tc.name, reply.MessageType())
			}
			continue
		}
		if reply == nil || reply.MessageType() != tc.want || reply.TransactionID != tc.req.TransactionID {
			t.Errorf("%s: reply %v, want a %s for the same transaction", tc.name, reply, tc.want)
			continue
		}
		if tc.want == dhcpv4.MessageTypeNak {
			continue
		}
		mtu := reply.Options.Get(dhcpv4.OptionInterfaceMTU)
		if !reply.YourIPAddr.Equal(net.IPv4(10, 0, 2, 2)) || reply.SubnetMask().String() != "ffffff00" ||
			!slices.ContainsFunc(reply.Router(), func(ip net.IP) bool { return ip.Equal(net.IPv4(10, 0, 2, 1)) }) ||
			len(reply.DNS()) != 1 || !reply.DNS()[0].Equal(net.IPv4(10, 96, 0, 10)) || len(mtu) != 2 || int(mtu[0])<<8|int(mtu[1]) != 1450 ||
			reply.IPAddressLeaseTime(0) == 0 || reply.DomainSearch() == nil {
			t.Errorf("%s: reply lacks what the guest needs:\n%s", tc.name, reply.Summary())
		}
	}
}
