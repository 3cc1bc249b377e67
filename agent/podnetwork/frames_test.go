package podnetwork

import (
	"encoding/binary"
	"net"
	"net/netip"
)

// Frames as a guest writes them to its tap, built by hand: the filter is tested on the bytes.

func ethernet(dst, src net.HardwareAddr, etherType uint16, payload []byte) []byte {
	f := append(append([]byte{}, dst...), src...)
	f = binary.BigEndian.AppendUint16(f, etherType)
	return append(f, payload...)
}

// udp4 is an IPv4 header (no options, checksummed) and a UDP datagram without a checksum.
func udp4(src, dst netip.Addr, sport, dport uint16, payload []byte) []byte {
	h := make([]byte, 20, 28+len(payload))
	h[0], h[8], h[9] = 0x45, 64, 17
	binary.BigEndian.PutUint16(h[2:], uint16(28+len(payload)))
	copy(h[12:], src.AsSlice())
	copy(h[16:], dst.AsSlice())
	var sum uint32
	for i := 0; i < 20; i += 2 {
		sum += uint32(binary.BigEndian.Uint16(h[i:]))
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	binary.BigEndian.PutUint16(h[10:], ^uint16(sum))
	h = binary.BigEndian.AppendUint16(h, sport)
	h = binary.BigEndian.AppendUint16(h, dport)
	h = binary.BigEndian.AppendUint16(h, uint16(8+len(payload)))
	h = binary.BigEndian.AppendUint16(h, 0)
	return append(h, payload...)
}

// arpRequest asks who has target, telling senderIP at senderMAC.
func arpRequest(senderMAC net.HardwareAddr, senderIP, target netip.Addr) []byte {
	a := []byte{0, 1, 8, 0, 6, 4, 0, 1}
	a = append(a, senderMAC...)
	a = append(a, senderIP.AsSlice()...)
	a = append(a, make([]byte, 6)...)
	return append(a, target.AsSlice()...)
}

// ipv6Header is a bare IPv6 header from src with no payload.
func ipv6Header(src netip.Addr) []byte {
	h := make([]byte, 40)
	h[0], h[6], h[7] = 0x60, 59, 64
	copy(h[8:], src.AsSlice())
	copy(h[24:], netip.MustParseAddr("ff02::1").AsSlice())
	return h
}

// vlanTagged wraps an IPv4 payload in an 802.1Q tag.
func vlanTagged(id uint16, ipv4 []byte) []byte {
	t := binary.BigEndian.AppendUint16(nil, id)
	t = binary.BigEndian.AppendUint16(t, 0x0800)
	return append(t, ipv4...)
}

const (
	typeIPv4 = 0x0800
	typeARP  = 0x0806
	typeIPv6 = 0x86dd
	typeVLAN = 0x8100
)
