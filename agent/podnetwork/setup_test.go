package podnetwork

import (
	"bytes"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/lifeboat-vm/lifeboat/api/notify"
)

// podNamespace makes a network namespace as a pod's runtime leaves it: an eth0 (one end of a
// veth pair whose other end stays there too) with 10.244.9.5/24 and a default route via
// 10.244.9.1. It returns the namespace, open.
func podNamespace(t *testing.T) *os.File {
	t.Helper()
	return newNamespace(t, func() error {
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: PodInterface, MTU: 1450}, PeerName: "peer0"}); err != nil {
			return err
		}
		eth0, err := netlink.LinkByName(PodInterface)
		if err != nil {
			return err
		}
		addr, _ := netlink.ParseAddr("10.244.9.5/24")
		for _, step := range []error{netlink.AddrAdd(eth0, addr), netlink.LinkSetUp(eth0)} {
			if step != nil {
				return step
			}
		}
		return netlink.RouteAdd(&netlink.Route{LinkIndex: eth0.Attrs().Index, Gw: net.ParseIP("10.244.9.1")})
	})
}

// newNamespace makes a network namespace, runs populate in it, and returns it, open.
func newNamespace(t *testing.T, populate func() error) *os.File {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("making network namespaces needs root: run the tests as root, as make test and .ci/run do (README, Prerequisites)")
	}
	path := filepath.Join(t.TempDir(), "netns")
	if err := os.WriteFile(path, nil, 0o444); err != nil {
		t.Fatal(err)
	}
	err := OnThread(func() error { return unix.Unshare(unix.CLONE_NEWNET) }, func() error {
		if err := unix.Mount("/proc/thread-self/ns/net", path, "", unix.MS_BIND, ""); err != nil {
			return err
		}
		return populate()
	})
	if err != nil {
		t.Fatalf("making a network namespace: %v", err)
	}
	ns, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ns.Close()
		_ = unix.Unmount(path, unix.MNT_DETACH)
	})
	return ns
}

func TestMasqueradeBuildsBridgeTapAndNAT(t *testing.T) {
	ns := podNamespace(t)
	plan := Plan{Binding: Masquerade, TapOwner: 107, GuestMAC: guestMAC, Ports: []PortRule{{Protocol: "TCP", Port: 8080}, {Protocol: "UDP", Port: 53}}}
	lease, err := Setup(ns, plan)
	if err != nil {
		t.Fatal(err)
	}
	want := notify.Lease{Interface: Bridge, Tap: Tap, Address: "10.0.2.2/24", Gateway: "10.0.2.1", Server: "10.0.2.1", MTU: 1450, MAC: guestMAC.String()}
	if *lease != want {
		t.Errorf("lease %+v, want %+v", *lease, want)
	}
	check := func() {
		t.Helper()
		err := inNamespace(ns, func() error {
			tap, err := netlink.LinkByName(Tap)
			if err != nil {
				return err
			}
			if tt, ok := tap.(*netlink.Tuntap); !ok || tt.Owner != 107 || tt.Mode != netlink.TUNTAP_MODE_TAP {
				t.Errorf("the tap is %+v; want a tap owned by the launcher's user 107, so its QEMU opens it without a capability", tap)
			}
			br, err := netlink.LinkByName(Bridge)
			if err != nil {
				return err
			}
			if tap.Attrs().MasterIndex != br.Attrs().Index || br.Attrs().Flags&net.FlagUp == 0 || tap.Attrs().Flags&net.FlagUp == 0 {
				t.Errorf("the tap is not on the bridge %s, or either is not up", Bridge)
			}
			// The guest's gateway has the same hardware address in every pod, the tap's
			// joining notwithstanding: a migrated guest's ARP cache holds on the target.
			if got := br.Attrs().HardwareAddr.String(); got != BridgeMAC.String() {
				t.Errorf("the bridge's address is %s, want %s in every pod", got, BridgeMAC)
			}
			addrs, _ := netlink.AddrList(br, netlink.FAMILY_V4)
			if len(addrs) != 1 || addrs[0].IPNet.String() != "10.0.2.1/24" {
				t.Errorf("the bridge's addresses are %v, want the guest's gateway 10.0.2.1/24", addrs)
			}
			for _, link := range []string{PodInterface, Bridge} {
				file := "/proc/sys/net/ipv4/conf/" + link + "/forwarding"
				if b, err := os.ReadFile(file); err != nil || strings.TrimSpace(string(b)) != "1" {
					t.Errorf("%s in the pod is %q (%v), want 1: the guest's packets cross %s", file, b, err, link)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		c, err := nftables.New(nftables.WithNetNSFd(int(ns.Fd())))
		if err != nil {
			t.Fatal(err)
		}
		table := &nftables.Table{Family: nftables.TableFamilyIPv4, Name: natTable}
		for chain, want := range map[string]int{"prerouting": 2, "postrouting": 1} {
			rules, err := c.GetRules(table, &nftables.Chain{Name: chain, Table: table})
			if err != nil || len(rules) != want {
				t.Errorf("chain %s has %d rules (%v), want %d", chain, len(rules), err, want)
			}
		}
	}
	check()
	// An agent restarted in the middle builds again over what is there.
	again, err := Setup(ns, plan)
	if err != nil || *again != want {
		t.Fatalf("building again: %+v, %v; want %+v", again, err, want)
	}
	check()
}

// The guest takes the pod's address and its MAC, the one the CNI plugin gave eth0: on a node
// bridge that other pods share, that MAC is the pod's alone.
func TestBridgeBindingGivesTheGuestThePodsAddress(t *testing.T) {
	ns := podNamespace(t)
	var podMAC net.HardwareAddr
	err := inNamespace(ns, func() error {
		eth0, err := netlink.LinkByName(PodInterface)
		podMAC = eth0.Attrs().HardwareAddr
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	want := notify.Lease{Interface: Bridge, Tap: Tap, Address: "10.244.9.5/24", Gateway: "10.244.9.1", Server: "169.254.75.10", MTU: 1450, MAC: podMAC.String()}
	for range 2 {
		lease, err := Setup(ns, Plan{Binding: BridgeMode, TapOwner: 107})
		if err != nil || *lease != want {
			t.Fatalf("Setup = %+v, %v; want %+v (the same the second time, from what the first recorded)", lease, err, want)
		}
	}
	err = inNamespace(ns, func() error {
		eth0, err := netlink.LinkByName(PodInterface)
		if err != nil {
			return err
		}
		br, err := netlink.LinkByName(Bridge)
		if err != nil {
			return err
		}
		if addrs, _ := netlink.AddrList(eth0, netlink.FAMILY_V4); len(addrs) != 0 || eth0.Attrs().MasterIndex != br.Attrs().Index {
			t.Errorf("eth0 keeps %v and is on master %d; want it on the bridge %d without an address", addrs, eth0.Attrs().MasterIndex, br.Attrs().Index)
		}
		if port, err := netlink.LinkGetProtinfo(eth0); err != nil || port.Learning {
			t.Errorf("eth0's bridge port learns addresses (%+v, %v); want not: a hairpin CNI bridge's echo of the guest's broadcasts would place the guest behind eth0", port, err)
		}
		if mac := eth0.Attrs().HardwareAddr; bytes.Equal(mac, podMAC) || mac[0]&0x03 != 0x02 {
			t.Errorf("eth0 has MAC %s; want a locally administered unicast one other than the guest's %s, which the bridge would otherwise keep for itself", mac, podMAC)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestSetupRefusesWhatIsNotAPodsNamespace(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("opening namespaces needs root: run the tests as root, as make test and .ci/run do (README, Prerequisites)")
	}
	own, err := os.Open("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	defer own.Close()
	if _, err := Setup(own, Plan{Binding: Masquerade}); err == nil || !strings.Contains(err.Error(), "node's network namespace") {
		t.Errorf("Setup on the agent's own namespace: %v; want a refusal", err)
	}
	file, err := os.Open(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	if _, err := Setup(file, Plan{Binding: Masquerade}); err == nil || !strings.Contains(err.Error(), "not a network namespace") {
		t.Errorf("Setup on a file: %v; want a refusal", err)
	}
}
