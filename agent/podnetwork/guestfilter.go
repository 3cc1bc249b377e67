package podnetwork

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// Guest filtering: everything the guest sends enters the pod's namespace through the tap, so
// one chain on the tap's ingress hook (netdev family) sees every frame before the bridge, ARP,
// routing or NAT do, and serves both bindings. It lets through only frames from the guest's own
// MAC that carry IPv4 from the guest's own address (or a DHCP request before it has one) or ARP
// that claims only the guest's own MAC and address. Anything else is dropped and counted, and so
// is DHCP server traffic (UDP from port 67): the guest is only ever a DHCP client, and with the
// bridge binding its answers would reach other pods' clients.
const (
	// filterTable is lifeboat's netdev table in the pod's namespace; it is replaced whole.
	filterTable = "lifeboat-guest"
	filterChain = "from-guest"
	// SpoofedCounter counts the frames dropped for a source MAC or IPv4 address, or an ARP
	// sender, that is not the guest's.
	SpoofedCounter = "spoofed"
	// UnsupportedCounter counts the frames dropped for a protocol the pod network does not
	// carry for the guest: IPv6, VLAN-tagged frames, anything but IPv4 and ARP.
	UnsupportedCounter = "unsupported"
)

// GuestIdentity is what the guest may send as: its card's MAC and the IPv4 address it leases.
type GuestIdentity struct {
	MAC     net.HardwareAddr
	Address netip.Addr
}

// Offsets in an Ethernet frame and in the headers after it.
const (
	ethSource     = 6
	ethType       = 12
	ipProtocol    = 9
	ipSource      = 12
	ipDestination = 16
	arpFixed      = 0 // hardware type, protocol type, their lengths: Ethernet and IPv4, 6 and 4
	arpSenderMAC  = 8
	arpSenderIP   = 14
)

var (
	etherIPv4  = []byte{0x08, 0x00}
	etherARP   = []byte{0x08, 0x06}
	arpEthIPv4 = []byte{0x00, 0x01, 0x08, 0x00, 6, 4}
	// dhcpPorts are a DHCP client's source and destination ports, 68 and 67.
	dhcpPorts        = []byte{0, 68, 0, 67}
	dhcpServerPort   = []byte{0, 67}
	unspecified      = []byte{0, 0, 0, 0}
	limitedBroadcast = []byte{255, 255, 255, 255}
)

// FilterRules are the expressions of the guest's ingress chain, rule by rule, in order; the
// chain's policy drops what none of them accepts.
func FilterRules(g GuestIdentity) ([][]expr.Any, error) {
	if len(g.MAC) != 6 || !g.Address.Is4() {
		return nil, fmt.Errorf("the guest's identity %s %s is not an Ethernet MAC and an IPv4 address", g.MAC, g.Address)
	}
	mac, addr := []byte(g.MAC), g.Address.AsSlice()
	accept := &expr.Verdict{Kind: expr.VerdictAccept}
	return [][]expr.Any{
		concat(match(expr.PayloadBaseLLHeader, ethSource, expr.CmpOpNeq, mac), drop(SpoofedCounter)),
		concat(isType(etherIPv4), match(expr.PayloadBaseNetworkHeader, ipProtocol, expr.CmpOpEq, []byte{unix.IPPROTO_UDP}),
			match(expr.PayloadBaseTransportHeader, 0, expr.CmpOpEq, dhcpServerPort), drop(SpoofedCounter)),
		concat(isType(etherIPv4), match(expr.PayloadBaseNetworkHeader, ipSource, expr.CmpOpEq, addr), []expr.Any{accept}),
		// DHCP's discover and request, broadcast before the guest has its address.
		concat(isType(etherIPv4), match(expr.PayloadBaseNetworkHeader, ipSource, expr.CmpOpEq, unspecified),
			match(expr.PayloadBaseNetworkHeader, ipDestination, expr.CmpOpEq, limitedBroadcast),
			match(expr.PayloadBaseNetworkHeader, ipProtocol, expr.CmpOpEq, []byte{unix.IPPROTO_UDP}),
			match(expr.PayloadBaseTransportHeader, 0, expr.CmpOpEq, dhcpPorts), []expr.Any{accept}),
		concat(isType(etherARP), match(expr.PayloadBaseNetworkHeader, arpFixed, expr.CmpOpEq, arpEthIPv4),
			match(expr.PayloadBaseNetworkHeader, arpSenderMAC, expr.CmpOpEq, mac),
			match(expr.PayloadBaseNetworkHeader, arpSenderIP, expr.CmpOpEq, addr), []expr.Any{accept}),
		// An address-conflict probe (RFC 5227) claims no address: its sender address is 0.0.0.0.
		concat(isType(etherARP), match(expr.PayloadBaseNetworkHeader, arpFixed, expr.CmpOpEq, arpEthIPv4),
			match(expr.PayloadBaseNetworkHeader, arpSenderMAC, expr.CmpOpEq, mac),
			match(expr.PayloadBaseNetworkHeader, arpSenderIP, expr.CmpOpEq, unspecified), []expr.Any{accept}),
		concat(isType(etherIPv4), drop(SpoofedCounter)),
		concat(isType(etherARP), drop(SpoofedCounter)),
		drop(UnsupportedCounter),
	}, nil
}

// isType matches the frame's EtherType as it is on the wire: a VLAN tag's type is 0x8100.
func isType(t []byte) []expr.Any {
	return match(expr.PayloadBaseLLHeader, ethType, expr.CmpOpEq, t)
}

func match(base expr.PayloadBase, offset uint32, op expr.CmpOp, data []byte) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: base, Offset: offset, Len: uint32(len(data))},
		&expr.Cmp{Op: op, Register: 1, Data: data},
	}
}

func drop(counter string) []expr.Any {
	return []expr.Any{
		&expr.Objref{Type: int(nftables.ObjTypeCounter), Name: counter},
		&expr.Verdict{Kind: expr.VerdictDrop},
	}
}

// guestFilter writes the guest's ingress chain on the tap in the namespace nsFD, replacing
// the table in the same transaction that writes it: never a moment without the filter.
func guestFilter(g GuestIdentity, nsFD int) error {
	rules, err := FilterRules(g)
	if err != nil {
		return err
	}
	c, err := nftables.New(nftables.WithNetNSFd(nsFD))
	if err != nil {
		return err
	}
	if old, err := c.ListTableOfFamily(filterTable, nftables.TableFamilyNetdev); err == nil && old != nil {
		c.DelTable(old)
	}
	t := c.AddTable(&nftables.Table{Family: nftables.TableFamilyNetdev, Name: filterTable})
	for _, name := range []string{SpoofedCounter, UnsupportedCounter} {
		c.AddObj(&nftables.CounterObj{Table: t, Name: name})
	}
	policy := nftables.ChainPolicyDrop
	chain := c.AddChain(&nftables.Chain{Name: filterChain, Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookIngress, Priority: nftables.ChainPriorityFilter, Device: Tap, Policy: &policy})
	for _, exprs := range rules {
		c.AddRule(&nftables.Rule{Table: t, Chain: chain, Exprs: exprs})
	}
	return c.Flush()
}

// DroppedFromGuest reads the filter's counters in the namespace ns: the frames dropped as
// spoofed and as unsupported since the filter was written.
func DroppedFromGuest(ns int) (spoofed, unsupported uint64, err error) {
	c, err := nftables.New(nftables.WithNetNSFd(ns))
	if err != nil {
		return 0, 0, err
	}
	t := &nftables.Table{Family: nftables.TableFamilyNetdev, Name: filterTable}
	for _, into := range []struct {
		name string
		n    *uint64
	}{{SpoofedCounter, &spoofed}, {UnsupportedCounter, &unsupported}} {
		obj, err := c.GetObject(&nftables.CounterObj{Table: t, Name: into.name})
		if err != nil {
			return 0, 0, fmt.Errorf("reading counter %s: %w", into.name, err)
		}
		counter, ok := obj.(*nftables.CounterObj)
		if !ok {
			return 0, 0, fmt.Errorf("object %s is a %T, not a counter", into.name, obj)
		}
		*into.n = counter.Packets
	}
	return spoofed, unsupported, nil
}
