package podnetwork

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/lifeboat-vm/lifeboat/api/notify"
)

// natTable is lifeboat's nftables table in the pod's namespace; it is replaced whole.
const natTable = "lifeboat"

// aliasPrefix marks eth0's alias where the bridge binding records the address and MAC it
// moved to the guest, so that building again (an agent restarted mid-way) finds it.
const aliasPrefix = "lifeboat-pod-address "

// Setup builds plan in the network namespace ns, a descriptor the launcher sent, and returns
// what the guest is to be offered. It is idempotent: a launcher whose first request found the
// agent restarting asks again, and finds what was built.
func Setup(ns *os.File, plan Plan) (*notify.Lease, error) {
	if err := checkNamespace(ns); err != nil {
		return nil, err
	}
	var lease *notify.Lease
	err := inNamespace(ns, func() error {
		var err error
		lease, err = build(plan, int(ns.Fd()))
		return err
	})
	return lease, err
}

// checkNamespace refuses a descriptor that is not a network namespace, or that is the agent's
// own: a launcher may only have its own pod's namespace built on.
func checkNamespace(ns *os.File) error {
	kind, err := unix.IoctlRetInt(int(ns.Fd()), unix.NS_GET_NSTYPE)
	if err != nil || kind != unix.CLONE_NEWNET {
		return errors.New("the descriptor is not a network namespace")
	}
	var theirs, ours unix.Stat_t
	if err := unix.Fstat(int(ns.Fd()), &theirs); err != nil {
		return err
	}
	if err := unix.Stat("/proc/thread-self/ns/net", &ours); err != nil {
		return err
	}
	if theirs.Dev == ours.Dev && theirs.Ino == ours.Ino {
		return errors.New("the descriptor is the node's network namespace, not a pod's")
	}
	return nil
}

// inNamespace runs fn on a thread that joined ns.
func inNamespace(ns *os.File, fn func() error) error {
	return OnThread(func() error {
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("joining the pod's network namespace: %w", err)
		}
		return nil
	}, fn)
}

// OnThread runs fn on a thread locked to it after enter moved the thread to another network
// namespace, and brings the thread back to the process's namespace before the scheduler may run
// anything else on it. A thread that cannot come back ends with its goroutine, so nothing else
// ever runs in a pod's namespace. Threads must not end needlessly either: a child started with
// Pdeathsig dies with the thread that started it.
func OnThread(enter, fn func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		home, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			done <- err
			return
		}
		defer home.Close()
		if err := enter(); err != nil {
			done <- err
			return
		}
		err = fn()
		if unix.Setns(int(home.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		done <- err
	}()
	return <-done
}

func build(plan Plan, nsFD int) (*notify.Lease, error) {
	eth0, err := netlink.LinkByName(PodInterface)
	if err != nil {
		return nil, fmt.Errorf("the pod has no %s: %w", PodInterface, err)
	}
	mtu := eth0.Attrs().MTU
	br, err := ensureLink(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: Bridge, MTU: mtu, HardwareAddr: BridgeMAC}})
	if err != nil {
		return nil, err
	}
	tap, err := ensureLink(&netlink.Tuntap{
		LinkAttrs: netlink.LinkAttrs{Name: Tap, MTU: mtu},
		Mode:      netlink.TUNTAP_MODE_TAP,
		Flags:     netlink.TUNTAP_NO_PI | netlink.TUNTAP_VNET_HDR,
		Owner:     plan.TapOwner, Group: plan.TapOwner,
	})
	if err != nil {
		return nil, err
	}
	if err := netlink.LinkSetMaster(tap, br); err != nil {
		return nil, fmt.Errorf("attaching %s to %s: %w", Tap, Bridge, err)
	}
	lease := &notify.Lease{Interface: Bridge, Tap: Tap, MTU: mtu}
	guestMAC := plan.GuestMAC
	switch plan.Binding {
	case Masquerade:
		err = masquerade(eth0, br, plan, nsFD, lease)
	case BridgeMode:
		guestMAC, err = bridge(eth0, br, lease)
	default:
		err = fmt.Errorf("unknown binding %q", plan.Binding)
	}
	if err != nil {
		return nil, err
	}
	// The filter is in place before the tap is up, so before QEMU may send anything.
	guestAddr, err := netip.ParsePrefix(lease.Address)
	if err != nil {
		return nil, err
	}
	lease.MAC = guestMAC.String()
	if err := guestFilter(GuestIdentity{MAC: guestMAC, Address: guestAddr.Addr()}, nsFD); err != nil {
		return nil, fmt.Errorf("writing the filter of what the guest sends: %w", err)
	}
	for _, l := range []netlink.Link{tap, br} {
		if err := netlink.LinkSetUp(l); err != nil {
			return nil, fmt.Errorf("bringing %s up: %w", l.Attrs().Name, err)
		}
	}
	return lease, nil
}

// ensureLink adds l unless a link of its name exists, and returns the link.
func ensureLink(l netlink.Link) (netlink.Link, error) {
	name := l.Attrs().Name
	if existing, err := netlink.LinkByName(name); err == nil {
		if existing.Type() != l.Type() {
			return nil, fmt.Errorf("%s exists and is a %s, not a %s", name, existing.Type(), l.Type())
		}
		return existing, nil
	}
	if err := netlink.LinkAdd(l); err != nil {
		return nil, fmt.Errorf("adding %s %s: %w", l.Type(), name, err)
	}
	return netlink.LinkByName(name)
}

func ensureAddr(l netlink.Link, p netip.Prefix) error {
	err := netlink.AddrAdd(l, &netlink.Addr{IPNet: prefixNet(p)})
	if err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("adding %s to %s: %w", p, l.Attrs().Name, err)
	}
	return nil
}

func prefixNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// masquerade makes the bridge the guest's gateway and NATs between the pod's address and the
// guest's: what comes in on eth0 (to the listed ports, or all) goes to the guest, and what the
// guest sends out leaves with the pod's address.
func masquerade(eth0, br netlink.Link, plan Plan, nsFD int, lease *notify.Lease) error {
	if err := ensureAddr(br, GatewayPrefix); err != nil {
		return err
	}
	// What comes in on eth0 for the guest, and what the guest sends out through the bridge.
	for _, l := range []netlink.Link{eth0, br} {
		if err := forward(l); err != nil {
			return fmt.Errorf("turning forwarding on for %s: %w", l.Attrs().Name, err)
		}
	}
	if err := natRules(plan, nsFD); err != nil {
		return fmt.Errorf("writing the NAT rules: %w", err)
	}
	lease.Address, lease.Gateway, lease.Server = GuestPrefix.String(), GatewayPrefix.Addr().String(), GatewayPrefix.Addr().String()
	return nil
}

func natRules(plan Plan, nsFD int) error {
	return writeNAT(nsFD, natSpec{table: natTable, prePriority: nftables.ChainPriorityNATDest, ports: plan.Ports,
		to: GuestPrefix.Addr(), masqueradeBy: ipSourceOffset})
}

// natSpec is a table of two NAT chains: what comes in on eth0 for ports goes to the address to,
// and what leaves by eth0 with that address at masqueradeBy (the source's offset or the
// destination's in the IPv4 header) leaves as the pod.
type natSpec struct {
	table        string
	prePriority  *nftables.ChainPriority
	ports        []PortRule
	to           netip.Addr
	masqueradeBy uint32
}

// IPv4 header offsets of the source and destination addresses.
const (
	ipSourceOffset      = 12
	ipDestinationOffset = 16
)

// writeNAT writes n's table in the namespace nsFD, replacing the table of that name in the same
// transaction that writes it: never half a rule set.
func writeNAT(nsFD int, n natSpec) error {
	c, err := nftables.New(nftables.WithNetNSFd(nsFD))
	if err != nil {
		return err
	}
	if old, err := c.ListTableOfFamily(n.table, nftables.TableFamilyIPv4); err == nil && old != nil {
		c.DelTable(old)
	}
	t := c.AddTable(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: n.table})
	pre := c.AddChain(&nftables.Chain{Name: "prerouting", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPrerouting, Priority: n.prePriority})
	post := c.AddChain(&nftables.Chain{Name: "postrouting", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource})
	to := n.to.AsSlice()
	dnat := []expr.Any{
		&expr.Immediate{Register: 1, Data: to},
		&expr.NAT{Type: expr.NATTypeDestNAT, Family: uint32(nftables.TableFamilyIPv4), RegAddrMin: 1},
	}
	for _, match := range portMatches(n.ports) {
		c.AddRule(&nftables.Rule{Table: t, Chain: pre, Exprs: concat(ifname(expr.MetaKeyIIFNAME, PodInterface), match, dnat)})
	}
	c.AddRule(&nftables.Rule{Table: t, Chain: post, Exprs: concat(
		ifname(expr.MetaKeyOIFNAME, PodInterface),
		[]expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: n.masqueradeBy, Len: 4},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: to},
			&expr.Masq{},
		})})
	return c.Flush()
}

// portMatches is one match per forwarded port, or a single empty match (every packet) when
// the plan lists none.
func portMatches(ports []PortRule) [][]expr.Any {
	if len(ports) == 0 {
		return [][]expr.Any{nil}
	}
	var out [][]expr.Any
	for _, p := range ports {
		proto := byte(unix.IPPROTO_TCP)
		if p.Protocol == "UDP" {
			proto = unix.IPPROTO_UDP
		}
		out = append(out, []expr.Any{
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(p.Port)},
		})
	}
	return out
}

func ifname(key expr.MetaKey, name string) []expr.Any {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, name)
	return []expr.Any{&expr.Meta{Key: key, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: b}}
}

func concat(parts ...[]expr.Any) []expr.Any {
	var out []expr.Any
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// bridge moves the pod's address and MAC to the guest: eth0 joins the bridge without an
// address and with another MAC, and the guest gets the address, with the pod's gateway, by DHCP,
// on a card with eth0's MAC, which it returns. The pod network gave that MAC to this pod alone,
// so on a node bridge that other pods share the guest cannot pass for one of them; and eth0
// must give it up because a bridge keeps its ports' MACs for itself.
func bridge(eth0, br netlink.Link, lease *notify.Lease) (net.HardwareAddr, error) {
	addr, gw, mac, err := podAddress(eth0)
	if err != nil {
		return nil, err
	}
	if bytes.Equal(eth0.Attrs().HardwareAddr, mac) {
		if err := netlink.LinkSetHardwareAddr(eth0, portMAC()); err != nil {
			return nil, fmt.Errorf("giving %s another MAC: %w", PodInterface, err)
		}
	}
	if err := netlink.LinkSetMaster(eth0, br); err != nil {
		return nil, fmt.Errorf("attaching %s to %s: %w", PodInterface, Bridge, err)
	}
	// A CNI bridge in hairpin mode sends the guest's broadcasts back in through eth0; learning
	// there would place the guest's MAC behind eth0, and the bridge would then drop the answers
	// to the guest's own ARP requests, which arrive through eth0 too.
	if err := netlink.LinkSetLearning(eth0, false); err != nil {
		return nil, fmt.Errorf("turning learning off on %s: %w", PodInterface, err)
	}
	if err := ensureAddr(br, BridgeBindingServer); err != nil {
		return nil, err
	}
	lease.Address, lease.Gateway, lease.Server = addr.String(), gw.String(), BridgeBindingServer.Addr().String()
	return mac, nil
}

// portMAC is a random, locally administered unicast MAC for eth0 as a port of the bridge: it
// never appears on the wire, since eth0 then sends only what the bridge forwards.
func portMAC() net.HardwareAddr {
	mac := make(net.HardwareAddr, 6)
	_, _ = rand.Read(mac)
	mac[0] = mac[0]&^0x01 | 0x02
	return mac
}

// podAddress is eth0's IPv4 address, default gateway and MAC, taken off eth0 and recorded in
// its alias the first time, read from the alias after that.
func podAddress(eth0 netlink.Link) (netip.Prefix, netip.Addr, net.HardwareAddr, error) {
	if alias, ok := strings.CutPrefix(eth0.Attrs().Alias, aliasPrefix); ok {
		a, rest, _ := strings.Cut(alias, " via ")
		g, m, _ := strings.Cut(rest, " mac ")
		addr, err1 := netip.ParsePrefix(a)
		gw, err2 := netip.ParseAddr(g)
		mac, err3 := net.ParseMAC(m)
		if err := errors.Join(err1, err2, err3); err != nil {
			return netip.Prefix{}, netip.Addr{}, nil, fmt.Errorf("reading the pod's address from %s's alias %q: %w", PodInterface, alias, err)
		}
		return addr, gw, mac, nil
	}
	addrs, err := netlink.AddrList(eth0, netlink.FAMILY_V4)
	if err != nil || len(addrs) == 0 {
		return netip.Prefix{}, netip.Addr{}, nil, fmt.Errorf("%s has no IPv4 address (%v)", PodInterface, err)
	}
	routes, err := netlink.RouteList(eth0, netlink.FAMILY_V4)
	if err != nil {
		return netip.Prefix{}, netip.Addr{}, nil, err
	}
	var gw netip.Addr
	for _, r := range routes {
		if (r.Dst == nil || r.Dst.IP.IsUnspecified()) && r.Gw != nil {
			gw, _ = netip.AddrFromSlice(r.Gw.To4())
		}
	}
	if !gw.IsValid() {
		return netip.Prefix{}, netip.Addr{}, nil, fmt.Errorf("%s has no default gateway", PodInterface)
	}
	mac := eth0.Attrs().HardwareAddr
	if len(mac) != 6 {
		return netip.Prefix{}, netip.Addr{}, nil, fmt.Errorf("%s has no Ethernet MAC (%q)", PodInterface, mac)
	}
	ip, _ := netip.AddrFromSlice(addrs[0].IP.To4())
	ones, _ := addrs[0].Mask.Size()
	addr := netip.PrefixFrom(ip, ones)
	if err := netlink.LinkSetAlias(eth0, aliasPrefix+addr.String()+" via "+gw.String()+" mac "+mac.String()); err != nil {
		return netip.Prefix{}, netip.Addr{}, nil, err
	}
	if err := netlink.AddrDel(eth0, &addrs[0]); err != nil {
		return netip.Prefix{}, netip.Addr{}, nil, fmt.Errorf("taking %s off %s: %w", addr, PodInterface, err)
	}
	return addr, gw, mac, nil
}

// forward turns IPv4 forwarding on for packets that come in on l, as the forwarding sysctl of l
// does, but through rtnetlink (IFLA_INET_CONF): the agent's container sees /proc/sys read-only,
// and the capability that this takes, CAP_NET_ADMIN, it has anyway for the links and the rules.
func forward(l netlink.Link) error {
	req := nl.NewNetlinkRequest(unix.RTM_SETLINK, unix.NLM_F_ACK)
	msg := nl.NewIfInfomsg(unix.AF_UNSPEC)
	msg.Index = int32(l.Attrs().Index)
	req.AddData(msg)
	spec := nl.NewRtAttr(unix.IFLA_AF_SPEC, nil)
	conf := spec.AddRtAttr(unix.AF_INET, nil).AddRtAttr(iflaInetConf, nil)
	conf.AddRtAttr(ipv4DevconfForwarding, nl.Uint32Attr(1))
	req.AddData(spec)
	_, err := req.Execute(unix.NETLINK_ROUTE, 0)
	return err
}

// From linux/if_link.h and linux/ip.h, which x/sys/unix does not carry.
const (
	iflaInetConf          = 1 // IFLA_INET_CONF
	ipv4DevconfForwarding = 1 // IPV4_DEVCONF_FORWARDING
)
