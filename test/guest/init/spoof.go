package main

import (
	"encoding/binary"
	"net"
	"net/netip"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/lifeboat-vm/lifeboat/test/guest/protocol"
)

// spoof tries, every second, to pass as other hosts, then sends as itself (protocol.SpoofParam).
// The forged frames go to the gateway's MAC, which the guest learns from its own datagrams'
// ARP, so the first round sends only the genuine one.
func spoof(con *console, eth0 netlink.Link, own *net.IPNet, gateway net.IP, to netip.AddrPort) {
	genuine, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(to))
	if err != nil {
		con.errorf("spoofing: %v", err)
		return
	}
	raw, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0)
	if err != nil {
		con.errorf("spoofing: a raw socket: %v", err)
		return
	}
	ownMAC := eth0.Attrs().HardwareAddr
	forgedMAC, _ := net.ParseMAC(protocol.ForgedMAC)
	ownIP, _ := netip.AddrFromSlice(own.IP.To4())
	gw, _ := netip.AddrFromSlice(gateway.To4())
	forged, reported := 0, false
	tick := time.NewTicker(time.Second)
	for ; ; <-tick.C {
		if gwMAC := neighbour(eth0, gateway); gwMAC != nil {
			for _, f := range []struct {
				dst     net.HardwareAddr
				payload []byte
			}{
				{gwMAC, ethernet(gwMAC, ownMAC, unix.ETH_P_IP, udp4(protocol.ForgedAddress(ownIP), to, protocol.ForgedPayloadPrefix+"address"))},
				{gwMAC, ethernet(gwMAC, forgedMAC, unix.ETH_P_IP, udp4(ownIP, to, protocol.ForgedPayloadPrefix+"MAC"))},
				{broadcastMAC, ethernet(broadcastMAC, ownMAC, unix.ETH_P_ARP, gratuitousARP(ownMAC, gw))},
			} {
				addr := &unix.SockaddrLinklayer{Ifindex: eth0.Attrs().Index, Halen: 6}
				copy(addr.Addr[:], f.dst)
				if err := unix.Sendto(raw, f.payload, 0, addr); err != nil {
					if !reported {
						con.errorf("spoofing: sending a forged frame: %v", err)
						reported = true
					}
					continue
				}
				forged++
			}
		}
		_, _ = genuine.Write([]byte(protocol.Genuine(forged)))
	}
}

var broadcastMAC = net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// neighbour is ip's MAC in eth0's neighbour table, nil until the guest's ARP resolved it.
func neighbour(eth0 netlink.Link, ip net.IP) net.HardwareAddr {
	neighs, err := netlink.NeighList(eth0.Attrs().Index, netlink.FAMILY_V4)
	if err != nil {
		return nil
	}
	for _, n := range neighs {
		if n.IP.Equal(ip) && len(n.HardwareAddr) == 6 && n.State&(netlink.NUD_INCOMPLETE|netlink.NUD_FAILED) == 0 {
			return n.HardwareAddr
		}
	}
	return nil
}

func ethernet(dst, src net.HardwareAddr, etherType uint16, payload []byte) []byte {
	f := append(append([]byte{}, dst...), src...)
	f = binary.BigEndian.AppendUint16(f, etherType)
	return append(f, payload...)
}

// udp4 is an IPv4 header (checksummed) and a UDP datagram without a checksum.
func udp4(src netip.Addr, to netip.AddrPort, payload string) []byte {
	h := make([]byte, 20, 28+len(payload))
	h[0], h[8], h[9] = 0x45, 64, unix.IPPROTO_UDP
	binary.BigEndian.PutUint16(h[2:], uint16(28+len(payload)))
	copy(h[12:], src.AsSlice())
	copy(h[16:], to.Addr().AsSlice())
	var sum uint32
	for i := 0; i < 20; i += 2 {
		sum += uint32(binary.BigEndian.Uint16(h[i:]))
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	binary.BigEndian.PutUint16(h[10:], ^uint16(sum))
	h = binary.BigEndian.AppendUint16(h, 40000)
	h = binary.BigEndian.AppendUint16(h, to.Port())
	h = binary.BigEndian.AppendUint16(h, uint16(8+len(payload)))
	h = binary.BigEndian.AppendUint16(h, 0)
	return append(h, payload...)
}

// gratuitousARP is an ARP reply announcing addr at mac: what a man in the middle sends to take
// over addr.
func gratuitousARP(mac net.HardwareAddr, addr netip.Addr) []byte {
	a := []byte{0, 1, 8, 0, 6, 4, 0, 2}
	a = append(a, mac...)
	a = append(a, addr.AsSlice()...)
	a = append(a, broadcastMAC...)
	return append(a, addr.AsSlice()...)
}
