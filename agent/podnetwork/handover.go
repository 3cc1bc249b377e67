package podnetwork

import (
	"fmt"
	"net/netip"
	"os"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
)

// The agent's log messages when a source pod starts and stops forwarding to its guest's new
// pod; the network benchmark reads them for its timeline.
const (
	MsgForwarding   = "the source pod forwards to the target pod"
	MsgForwardEnded = "the source pod stopped forwarding to the target pod"
)

// handoverTable is the nftables table, in a migration source pod's namespace, that forwards
// to the target pod what still reaches the source after the guest left. It is separate from
// natTable and from any other table of lifeboat's, so each is replaced or removed alone.
const handoverTable = "lifeboat-handover"

// Forward is what a source pod sends on once its guest has left it.
type Forward struct {
	// Target is the target pod's address.
	Target netip.Addr
	// Ports are the guest's forwarded ports (none: every port), as the masquerade plan has them.
	Ports []PortRule
}

// StartForward makes the source pod whose network namespace is ns send what comes in on
// eth0 for the guest to the target pod instead, from the source pod's own address so that the
// replies come back through it, and forgets the connections tracked towards the guest, so that
// a client's retransmission is forwarded too rather than follow the old translation to a guest
// that is gone.
func StartForward(ns *os.File, f Forward) error {
	if !f.Target.Is4() {
		return fmt.Errorf("the target pod's address %s is not IPv4", f.Target)
	}
	if err := checkNamespace(ns); err != nil {
		return err
	}
	return inNamespace(ns, func() error {
		if err := forwardRules(f, int(ns.Fd())); err != nil {
			return fmt.Errorf("writing the forwarding rules: %w", err)
		}
		// The guest has left: every connection tracked here was the guest's, and each
		// must be translated again, now towards the target.
		if err := netlink.ConntrackTableFlush(netlink.ConntrackTable); err != nil {
			return fmt.Errorf("forgetting the connections to the guest: %w", err)
		}
		return nil
	})
}

// StopForward removes what StartForward built; it is done if there is nothing to remove.
func StopForward(ns *os.File) error {
	if err := checkNamespace(ns); err != nil {
		return err
	}
	c, err := nftables.New(nftables.WithNetNSFd(int(ns.Fd())))
	if err != nil {
		return err
	}
	t, err := c.ListTableOfFamily(handoverTable, nftables.TableFamilyIPv4)
	if err != nil || t == nil {
		return nil
	}
	c.DelTable(t)
	return c.Flush()
}

func forwardRules(f Forward, nsFD int) error {
	// Before natTable's translation to the guest: a connection takes the first translation
	// it meets.
	return writeNAT(nsFD, natSpec{table: handoverTable, prePriority: nftables.ChainPriorityRef(*nftables.ChainPriorityNATDest - 10),
		ports: f.Ports, to: f.Target, masqueradeBy: ipDestinationOffset})
}
