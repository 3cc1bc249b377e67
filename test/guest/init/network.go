package main

import (
	"context"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync/atomic"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/dhcpv4/nclient4"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/lifeboat-vm/lifeboat/test/guest/protocol"
)

// counter is the guest's counter, which count advances and the server reports.
var counter atomic.Int64

// startNetwork configures the guest's card by DHCP, if it has one, and answers on
// protocol.ServePort; with spoofTo valid, it also tries to pass as other hosts (spoof). A guest
// without a card has nothing to do here.
func startNetwork(con *console, spoofTo netip.AddrPort) error {
	if _, err := os.Stat("/sys/class/net/eth0"); err != nil {
		return nil
	}
	for _, name := range []string{"lo", "eth0"} {
		l, err := netlink.LinkByName(name)
		if err == nil {
			err = netlink.LinkSetUp(l)
		}
		if err != nil {
			return fmt.Errorf("bringing %s up: %w", name, err)
		}
	}
	eth0, err := netlink.LinkByName("eth0")
	if err != nil {
		return err
	}
	// Under TCG, with no hardware RNG, the kernel's pool may stay uninitialised for minutes and
	// getrandom would block: the DHCP client's transaction IDs and the boot identity need no
	// secrecy, only to differ.
	os.Setenv("UROOT_NOHWRNG", "1")
	client, err := nclient4.New("eth0", nclient4.WithTimeout(5*time.Second), nclient4.WithRetry(6))
	if err != nil {
		return fmt.Errorf("DHCP client: %w", err)
	}
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	lease, err := client.Request(ctx)
	if err != nil {
		return fmt.Errorf("DHCP: %w", err)
	}
	ack := lease.ACK
	addr := &net.IPNet{IP: ack.YourIPAddr, Mask: ack.SubnetMask()}
	if err := netlink.AddrAdd(eth0, &netlink.Addr{IPNet: addr}); err != nil {
		return fmt.Errorf("adding %s: %w", addr, err)
	}
	if mtu := ack.Options.Get(dhcpv4.OptionInterfaceMTU); len(mtu) == 2 {
		_ = netlink.LinkSetMTU(eth0, int(mtu[0])<<8|int(mtu[1]))
	}
	routers := ack.Router()
	if len(routers) == 0 {
		return fmt.Errorf("DHCP gave no router")
	}
	if err := netlink.RouteAdd(&netlink.Route{LinkIndex: eth0.Attrs().Index, Gw: routers[0]}); err != nil {
		return fmt.Errorf("default route via %s: %w", routers[0], err)
	}
	boot := make([]byte, 8)
	_, _ = unix.Getrandom(boot, unix.GRND_INSECURE)
	l, err := net.Listen("tcp", fmt.Sprintf(":%d", protocol.ServePort))
	if err != nil {
		return err
	}
	id := hex.EncodeToString(boot)
	goSafely(con, "server", func() { serve(l, id) })
	con.println(protocol.Network(addr.String(), routers[0].String(), eth0.Attrs().HardwareAddr.String()))
	if spoofTo.IsValid() {
		goSafely(con, "spoofing", func() { spoof(con, eth0, addr, routers[0], spoofTo) })
	}
	return nil
}

func serve(l net.Listener, boot string) {
	for {
		c, err := l.Accept()
		if err != nil {
			continue
		}
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		fmt.Fprintln(c, protocol.Answer(boot, int(counter.Load())))
		c.Close()
	}
}
