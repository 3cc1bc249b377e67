package podnetwork

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/util/wait"
)

// A guest, played by the test writing frames to its tap, sends from a forged IPv4 address, from
// a forged MAC, ARP claiming a forged sender address and a forged sender MAC, and a DHCP offer
// as if it were a DHCP server, then as itself
// (a DHCP request, a datagram and ARP): where its frames go next (the bridge, behind
// masquerade; the pod network, with the bridge binding) sees only the genuine ones, and the
// filter counted each forgery.
func TestAGuestSendsOnlyAsItself(t *testing.T) {
	for _, binding := range []Binding{Masquerade, BridgeMode} {
		t.Run(string(binding), func(t *testing.T) {
			ns := podNamespace(t)
			outside := outsideNamespace(t, ns)
			lease, err := Setup(ns, Plan{Binding: binding, TapOwner: 107, GuestMAC: guestMAC})
			if err != nil {
				t.Fatal(err)
			}
			own := netip.MustParsePrefix(lease.Address).Addr()
			me, err := net.ParseMAC(lease.MAC)
			if err != nil {
				t.Fatalf("the lease's MAC %q: %v", lease.MAC, err)
			}
			gateway := netip.MustParseAddr(lease.Gateway)
			forged := own.As4()
			forged[3] = 77
			forgedIP := netip.AddrFrom4(forged)

			// The frames' next hop, and where a frame that got past the filter shows.
			watchNS, watchLink, nextHop := ns, Bridge, Bridge
			if binding == BridgeMode {
				watchNS, watchLink, nextHop = outside, "peer0", "peer0"
			}
			dst := hardwareAddr(t, watchNS, nextHop)
			capture := openCapture(t, watchNS, watchLink)
			tap := openTap(t, ns)
			waitOperUp(t, ns, Tap, PodInterface)

			send := func(frame []byte) {
				t.Helper()
				if _, err := unix.Write(tap, frame); err != nil {
					t.Fatalf("writing to the tap: %v", err)
				}
			}
			send(ethernet(dst, me, typeIPv4, udp4(forgedIP, gateway, 40000, 9999, []byte("forged address"))))
			send(ethernet(dst, otherMAC, typeIPv4, udp4(own, gateway, 40000, 9999, []byte("forged MAC"))))
			send(ethernet(broadcast, me, typeARP, arpRequest(me, forgedIP, gateway)))
			send(ethernet(broadcast, me, typeARP, arpRequest(otherMAC, own, gateway)))
			send(ethernet(broadcast, me, typeIPv6, ipv6Header(netip.MustParseAddr("fe80::1"))))
			send(ethernet(broadcast, me, typeIPv4, udp4(own, broadcast4, 67, 68, []byte("OFFER"))))
			send(ethernet(broadcast, me, typeIPv4, udp4(zeroIP, broadcast4, 68, 67, []byte("DHCP"))))
			send(ethernet(dst, me, typeIPv4, udp4(own, gateway, 40000, 9999, []byte("genuine"))))
			send(ethernet(broadcast, me, typeARP, arpRequest(me, own, gateway)))

			// The tap hands frames on in the order written, so once both genuine frames are
			// seen every forged one has either shown or been dropped.
			var sawDHCP, sawIP, sawARP bool
			deadline := time.Now().Add(10 * time.Second)
			buf := make([]byte, 2048)
			for !(sawDHCP && sawIP && sawARP) && time.Now().Before(deadline) {
				n, _, err := unix.Recvfrom(capture, buf, 0)
				if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
					continue
				}
				if err != nil {
					t.Fatal(err)
				}
				f := buf[:n]
				if len(f) < 14 {
					continue
				}
				src, etherType, payload := net.HardwareAddr(f[6:12]), binary.BigEndian.Uint16(f[12:]), f[14:]
				switch {
				case bytes.Equal(src, otherMAC):
					t.Errorf("%s saw a frame from the forged MAC %s: % x", watchLink, otherMAC, f)
				case etherType == typeIPv4 && len(payload) >= 20 && netip.AddrFrom4([4]byte(payload[12:16])) == forgedIP:
					t.Errorf("%s saw IPv4 from the forged address %s", watchLink, forgedIP)
				case etherType == typeIPv6 && bytes.Equal(src, me):
					t.Errorf("%s saw the guest's IPv6, which the pod network does not carry for it", watchLink)
				case etherType == typeARP && len(payload) >= 28:
					sender, senderIP := net.HardwareAddr(payload[8:14]), netip.AddrFrom4([4]byte(payload[14:18]))
					switch {
					case senderIP == forgedIP || bytes.Equal(sender, otherMAC):
						t.Errorf("%s saw ARP claiming %s at %s", watchLink, senderIP, sender)
					case senderIP == own && bytes.Equal(sender, me):
						sawARP = true
					}
				case etherType == typeIPv4 && bytes.Contains(payload, []byte("OFFER")):
					t.Errorf("%s saw the guest's DHCP offer: the guest may serve DHCP", watchLink)
				case etherType == typeIPv4 && bytes.Contains(payload, []byte("genuine")):
					sawIP = true
				case etherType == typeIPv4 && bytes.Contains(payload, []byte("DHCP")):
					sawDHCP = true
				}
			}
			if !sawDHCP || !sawIP || !sawARP {
				t.Fatalf("%s did not see the guest's own frames within 10s (DHCP %v, IPv4 %v, ARP %v): the filter drops the genuine too", watchLink, sawDHCP, sawIP, sawARP)
			}
			spoofed, unsupported, err := DroppedFromGuest(int(ns.Fd()))
			if err != nil || spoofed != 5 || unsupported != 1 {
				t.Errorf("the filter counted %d spoofed and %d unsupported (%v); want the 4 forgeries, the DHCP offer and the IPv6 frame", spoofed, unsupported, err)
			}
		})
	}
}

// outsideNamespace moves the pod's veth peer into a namespace of its own, as the node's side
// of the pod network, with the pod's gateway address 10.244.9.1.
func outsideNamespace(t *testing.T, pod *os.File) *os.File {
	t.Helper()
	outside := newNamespace(t, func() error { return nil })
	err := inNamespace(pod, func() error {
		peer, err := netlink.LinkByName("peer0")
		if err != nil {
			return err
		}
		return netlink.LinkSetNsFd(peer, int(outside.Fd()))
	})
	if err == nil {
		err = inNamespace(outside, func() error {
			peer, err := netlink.LinkByName("peer0")
			if err != nil {
				return err
			}
			addr, _ := netlink.ParseAddr("10.244.9.1/24")
			return errors.Join(netlink.AddrAdd(peer, addr), netlink.LinkSetUp(peer))
		})
	}
	if err != nil {
		t.Fatalf("moving the pod's veth peer out: %v", err)
	}
	return outside
}

func hardwareAddr(t *testing.T, ns *os.File, link string) net.HardwareAddr {
	t.Helper()
	var mac net.HardwareAddr
	err := inNamespace(ns, func() error {
		l, err := netlink.LinkByName(link)
		if err == nil {
			mac = l.Attrs().HardwareAddr
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return mac
}

// openCapture is a packet socket in ns that sees every frame on link, waiting at most 200 ms a read.
func openCapture(t *testing.T, ns *os.File, link string) int {
	t.Helper()
	proto := int(htons(unix.ETH_P_ALL))
	fd := -1
	err := inNamespace(ns, func() error {
		l, err := netlink.LinkByName(link)
		if err != nil {
			return err
		}
		if fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, proto); err != nil {
			return err
		}
		return errors.Join(
			unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: l.Attrs().Index}),
			unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Usec: 200_000}))
	})
	if fd >= 0 {
		t.Cleanup(func() { unix.Close(fd) })
	}
	if err != nil {
		t.Fatalf("watching %s: %v", link, err)
	}
	return fd
}

// openTap opens the guest's tap in ns as QEMU does, without the virtio header: what is written
// is a frame the guest sent.
func openTap(t *testing.T, ns *os.File) int {
	t.Helper()
	fd := -1
	err := inNamespace(ns, func() error {
		var err error
		if fd, err = unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0); err != nil {
			return err
		}
		ifr, err := unix.NewIfreq(Tap)
		if err != nil {
			return err
		}
		ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI)
		return unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr)
	})
	if fd >= 0 {
		t.Cleanup(func() { unix.Close(fd) })
	}
	if err != nil {
		t.Fatalf("opening the tap: %v", err)
	}
	return fd
}

// waitOperUp waits until the links in ns are up with a carrier, so that the bridge forwards.
func waitOperUp(t *testing.T, ns *os.File, links ...string) {
	t.Helper()
	var state string
	err := wait.PollUntilContextTimeout(context.Background(), 20*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		up := true
		err := inNamespace(ns, func() error {
			for _, name := range links {
				l, err := netlink.LinkByName(name)
				if err != nil {
					return err
				}
				if l.Attrs().OperState != netlink.OperUp {
					up, state = false, name+" is "+l.Attrs().OperState.String()
				}
			}
			return nil
		})
		return up, err
	})
	if err != nil {
		t.Fatalf("waiting for %v to be up with a carrier: %v (%s)", links, err, state)
	}
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }
