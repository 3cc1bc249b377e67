package launcher

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strings"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/dhcpv4/server4"

	"github.com/lifeboat-vm/lifeboat/api/notify"
)

// leaseSeconds is the lease the guest gets. Its address never changes, so the lease is long;
// a renewal after a migration reaches the target pod's server, which offers the same.
const leaseSeconds = 24 * 60 * 60

// Offer is what the launcher's DHCP server gives the guest.
type Offer struct {
	// MAC is the guest's card's: the only client the server answers. With the bridge binding
	// the server also hears other pods' clients, through eth0, and must leave them alone.
	MAC     net.HardwareAddr
	Address netip.Prefix
	Gateway netip.Addr
	Server  netip.Addr
	MTU     uint16
	DNS     []netip.Addr
	Search  []string
}

// OfferFor is the offer for the agent's lease, with the pod's name servers and search domains
// from resolvConf (the pod's /etc/resolv.conf). Loopback name servers are left out: they are
// the pod's, not reachable from the guest.
func OfferFor(lease *notify.Lease, resolvConf []byte) (Offer, error) {
	addr, err := netip.ParsePrefix(lease.Address)
	if err != nil || !addr.Addr().Is4() {
		return Offer{}, fmt.Errorf("the agent's lease has no IPv4 address: %q", lease.Address)
	}
	gw, err1 := netip.ParseAddr(lease.Gateway)
	server, err2 := netip.ParseAddr(lease.Server)
	if err := errors.Join(err1, err2); err != nil {
		return Offer{}, fmt.Errorf("the agent's lease: %w", err)
	}
	if lease.MTU < 576 || lease.MTU > 65535 {
		return Offer{}, fmt.Errorf("the agent's lease: MTU %d out of range", lease.MTU)
	}
	mac, err := net.ParseMAC(lease.MAC)
	if err != nil || len(mac) != 6 {
		return Offer{}, fmt.Errorf("the agent's lease has no Ethernet MAC for the guest: %q", lease.MAC)
	}
	o := Offer{MAC: mac, Address: addr, Gateway: gw, Server: server, MTU: uint16(lease.MTU)}
	sc := bufio.NewScanner(bytes.NewReader(resolvConf))
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 {
			continue
		}
		switch fields[0] {
		case "nameserver":
			if a, err := netip.ParseAddr(fields[1]); err == nil && a.Is4() && !a.IsLoopback() {
				o.DNS = append(o.DNS, a)
			}
		case "search":
			o.Search = fields[1:]
		}
	}
	return o, nil
}

// Reply is the server's answer to req: an offer to a discover, an ack to a request for the
// offered address, a nak to a request for any other; nil for anything else, and for any client
// but the guest.
func (o Offer) Reply(req *dhcpv4.DHCPv4) (*dhcpv4.DHCPv4, error) {
	if !bytes.Equal(req.ClientHWAddr, o.MAC) {
		return nil, nil
	}
	var kind dhcpv4.MessageType
	switch req.MessageType() {
	case dhcpv4.MessageTypeDiscover:
		kind = dhcpv4.MessageTypeOffer
	case dhcpv4.MessageTypeRequest:
		kind = dhcpv4.MessageTypeAck
		want := req.RequestedIPAddress()
		if want == nil || want.IsUnspecified() {
			want = req.ClientIPAddr
		}
		if !want.Equal(o.Address.Addr().AsSlice()) {
			return dhcpv4.NewReplyFromRequest(req, dhcpv4.WithMessageType(dhcpv4.MessageTypeNak),
				dhcpv4.WithOption(dhcpv4.OptServerIdentifier(o.Server.AsSlice())))
		}
	default:
		return nil, nil
	}
	mtu := make([]byte, 2)
	binary.BigEndian.PutUint16(mtu, o.MTU)
	mods := []dhcpv4.Modifier{
		dhcpv4.WithMessageType(kind),
		dhcpv4.WithYourIP(o.Address.Addr().AsSlice()),
		dhcpv4.WithServerIP(o.Server.AsSlice()),
		dhcpv4.WithNetmask(net.CIDRMask(o.Address.Bits(), 32)),
		dhcpv4.WithLeaseTime(leaseSeconds),
		dhcpv4.WithOption(dhcpv4.OptServerIdentifier(o.Server.AsSlice())),
		dhcpv4.WithOption(dhcpv4.OptRouter(o.Gateway.AsSlice())),
		dhcpv4.WithGeneric(dhcpv4.OptionInterfaceMTU, mtu),
	}
	if len(o.DNS) > 0 {
		var dns []net.IP
		for _, a := range o.DNS {
			dns = append(dns, a.AsSlice())
		}
		mods = append(mods, dhcpv4.WithOption(dhcpv4.OptDNS(dns...)))
	}
	if len(o.Search) > 0 {
		mods = append(mods, dhcpv4.WithDomainSearchList(o.Search...))
	}
	return dhcpv4.NewReplyFromRequest(req, mods...)
}

// StartDHCP answers the guest on the bridge iface until ctx ends. The pod's sysctl
// net.ipv4.ip_unprivileged_port_start (the VMI controller sets it) lets its user bind port 67.
func StartDHCP(ctx context.Context, iface string, o Offer, log *slog.Logger) error {
	handler := func(conn net.PacketConn, peer net.Addr, req *dhcpv4.DHCPv4) {
		reply, err := o.Reply(req)
		if err != nil {
			log.Warn("DHCP: answering the guest", "err", err)
			return
		}
		if reply == nil {
			return
		}
		// The guest has no address until it has the ack: answer it by broadcast on the bridge.
		to := peer
		if u, ok := peer.(*net.UDPAddr); !ok || u.IP.IsUnspecified() || req.IsBroadcast() {
			to = &net.UDPAddr{IP: net.IPv4bcast, Port: dhcpv4.ClientPort}
		}
		if _, err := conn.WriteTo(reply.ToBytes(), to); err != nil {
			log.Warn("DHCP: sending the answer", "err", err)
			return
		}
		log.Info("DHCP: answered the guest", "type", reply.MessageType().String(), "address", o.Address.String(), "mac", req.ClientHWAddr.String())
	}
	srv, err := server4.NewServer(iface, &net.UDPAddr{Port: dhcpv4.ServerPort}, handler)
	if err != nil {
		return fmt.Errorf("listening for DHCP on %s: %w", iface, err)
	}
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	go func() {
		if err := srv.Serve(); err != nil && ctx.Err() == nil {
			log.Error("DHCP: the server stopped", "err", err)
		}
	}()
	return nil
}

// readResolvConf is the pod's resolver configuration; a pod without one offers no DNS.
func readResolvConf() []byte {
	b, _ := os.ReadFile("/etc/resolv.conf")
	return b
}
