package e2e

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/test/guest/protocol"
	"github.com/lifeboat-vm/lifeboat/test/node"
)

// spoofer is one guest that tries to pass as other hosts, as the pod network sees it.
type spoofer struct {
	vmi   *v1alpha1.VirtualMachineInstance
	mac   net.HardwareAddr
	podIP netip.Addr
	// forgedIP is the address the guest forges: beside its own, which behind masquerade is
	// the fixed private one.
	forgedIP netip.Addr
	// genuine counts the guest's own datagrams the pod network carried; forgeries is the most
	// forged frames the guest said it had sent before one of them.
	genuine, forgeries int
	// frames counts every frame from the guest's MAC the pod network carried, by EtherType.
	frames map[uint16]int
}

// Two guests on one node, one behind masquerade and one with the bridge binding, try once a
// second to pass as other hosts: a datagram from a forged address, one from a forged MAC, and a
// gratuitous ARP claiming their gateway's address. The node's side of the pod network, where
// every frame a pod sends arrives, carries each guest's own datagrams, sent after its forgeries,
// and none of the forgeries; the agent counts them for each VM.
func TestAGuestThatSpoofsIsSeenOnlyAsItself(t *testing.T) {
	startController(t)
	network := node.NewTestNetwork(t)
	nodes := startNodes(t, 1, node.OnNetwork(network))
	capture := captureFabric(t, network)
	ns := testNamespace(t)
	const to = "192.0.2.1:9"
	var spoofers []*spoofer
	for _, binding := range []string{"masquerade", "bridge"} {
		v := createVMI(t, ns, newVMI("spoof-"+binding, func(v *v1alpha1.VirtualMachineInstance) {
			iface := v1alpha1.Interface{Name: "default"}
			if binding == "masquerade" {
				iface.Masquerade = &v1alpha1.InterfaceMasquerade{}
			} else {
				iface.Bridge = &v1alpha1.InterfaceBridge{}
			}
			v.Spec.Interfaces = []v1alpha1.Interface{iface}
			v.Spec.Networks = []v1alpha1.Network{{Name: "default", Pod: &v1alpha1.PodNetwork{}}}
			v.Spec.Boot.Cmdline += " " + protocol.SpoofParam + "=" + to
		}))
		spoofers = append(spoofers, &spoofer{vmi: v, frames: map[uint16]int{}})
	}
	for _, s := range spoofers {
		s.vmi = waitVMI(t, ns, s.vmi.Name, bootTimeout, "phase Running", running)
		pod := launcherPod(t, s.vmi)
		// Behind masquerade the guest's card has the VMI's MAC; with the bridge binding, the pod's own.
		mac, err := s.vmi.Spec.Interfaces[0].MAC(string(s.vmi.UID))
		if s.vmi.Spec.Interfaces[0].Bridge != nil {
			mac, err = network.PodMAC(string(pod.UID))
		}
		if err != nil {
			t.Fatal(err)
		}
		s.mac = mac
		if s.podIP, err = netip.ParseAddr(pod.Status.PodIP); err != nil {
			t.Fatal(err)
		}
		s.forgedIP = protocol.ForgedAddress(s.podIP)
		if s.vmi.Spec.Interfaces[0].Masquerade != nil {
			s.forgedIP = protocol.ForgedAddress(netip.MustParseAddr("10.0.2.2"))
		}
	}
	forgedMAC, _ := net.ParseMAC(protocol.ForgedMAC)

	// Three rounds of forgeries before a genuine datagram: each was sent, and has been dropped
	// or carried, by the time the pod network carries that datagram.
	const enough = 9
	done := func() bool {
		for _, s := range spoofers {
			if s.forgeries < enough {
				return false
			}
		}
		return true
	}
	deadline := time.Now().Add(bootTimeout)
	buf := make([]byte, 4096)
	reported := map[string]bool{}
	for !done() && time.Now().Before(deadline) {
		n, _, err := unix.Recvfrom(capture, buf, 0)
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if problem := checkFrame(buf[:n], spoofers, forgedMAC); problem != "" && !reported[problem] {
			t.Error(problem)
			reported[problem] = true
		}
	}
	for _, s := range spoofers {
		if s.forgeries < enough {
			console, _ := os.ReadFile(nodes[0].consolePath(s.vmi))
			dropped := func(reason string) float64 {
				return nodes[0].metric(t, fmt.Sprintf(`lifeboat_agent_guest_frames_dropped_total{namespace=%q,reason=%q,vmi=%q}`, ns, reason, s.vmi.Name))
			}
			t.Errorf("%s: the pod network carried %d datagrams of the guest's own within %s, the last sent after %d forgeries, not %d, and frames from its MAC by EtherType %v; the filter dropped %v spoofed and %v unsupported: the filter drops the guest's own, or the guest did not spoof; its console:\n%s",
				s.vmi.Name, s.genuine, bootTimeout, s.forgeries, enough, s.frames, dropped("spoofed"), dropped("unsupported"), tail(withoutCounters(string(console)), 15))
		}
		sample := fmt.Sprintf(`lifeboat_agent_guest_frames_dropped_total{namespace=%q,reason="spoofed",vmi=%q}`, ns, s.vmi.Name)
		if got := nodes[0].metric(t, sample); got < float64(s.forgeries) {
			t.Errorf("%s = %v; want at least the %d forgeries the guest sent", sample, got, s.forgeries)
		}
	}
}

// checkFrame says what is wrong with a frame the pod network carried, or records a guest's
// genuine datagram in spoofers.
func checkFrame(f []byte, spoofers []*spoofer, forgedMAC net.HardwareAddr) string {
	if len(f) < 14 {
		return ""
	}
	src, etherType, payload := net.HardwareAddr(f[6:12]), binary.BigEndian.Uint16(f[12:]), f[14:]
	if bytes.Equal(src, forgedMAC) {
		return fmt.Sprintf("the pod network carried a frame from the forged MAC %s", src)
	}
	for _, s := range spoofers {
		if bytes.Equal(src, s.mac) {
			s.frames[etherType]++
		}
	}
	switch {
	case etherType == unix.ETH_P_ARP && len(payload) >= 28:
		sender, senderIP := net.HardwareAddr(payload[8:14]), netip.AddrFrom4([4]byte(payload[14:18]))
		for _, s := range spoofers {
			if bytes.Equal(sender, s.mac) && senderIP != s.podIP && senderIP != netip.IPv4Unspecified() {
				return fmt.Sprintf("the pod network carried ARP from %s's guest claiming %s", s.vmi.Name, senderIP)
			}
		}
	case etherType == unix.ETH_P_IP && len(payload) >= 28 && payload[9] == unix.IPPROTO_UDP:
		srcIP := netip.AddrFrom4([4]byte(payload[12:16]))
		data := payload[int(payload[0]&0x0f)*4+8:]
		if bytes.HasPrefix(data, []byte(protocol.ForgedPayloadPrefix)) {
			return fmt.Sprintf("the pod network carried a forged datagram %q from %s", data, srcIP)
		}
		for _, s := range spoofers {
			if srcIP == s.forgedIP {
				return fmt.Sprintf("the pod network carried a datagram from %s, the address %s's guest forges", srcIP, s.vmi.Name)
			}
			rest, ok := bytes.CutPrefix(data, []byte(protocol.GenuinePrefix))
			if n, err := strconv.Atoi(string(rest)); ok && err == nil && srcIP == s.podIP {
				s.genuine++
				s.forgeries = max(s.forgeries, n)
			}
		}
	}
	return ""
}

// captureFabric is a packet socket in the fabric that sees every frame on every node's side of
// the pod network, waiting at most 200 ms a read.
func captureFabric(t *testing.T, network *node.Network) int {
	t.Helper()
	all := int(uint16(unix.ETH_P_ALL)<<8 | uint16(unix.ETH_P_ALL)>>8)
	fd := -1
	err := network.Do(func() error {
		var err error
		if fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, all); err != nil {
			return err
		}
		return unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Usec: 200_000})
	})
	if fd >= 0 {
		t.Cleanup(func() { unix.Close(fd) })
	}
	if err != nil {
		t.Fatalf("watching the pod network: %v", err)
	}
	return fd
}

// withoutCounters is console without the guest's counter lines.
func withoutCounters(console string) string {
	var kept []string
	for _, line := range strings.Split(console, "\n") {
		if !strings.HasPrefix(line, protocol.CounterPrefix) {
			kept = append(kept, line)
		}
	}
	return strings.Join(kept, "\n")
}
