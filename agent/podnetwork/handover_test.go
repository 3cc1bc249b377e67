package podnetwork

import (
	"net/netip"
	"os"
	"testing"

	"github.com/google/nftables"
)

// A source pod's forward is a table of its own beside the masquerade's: it translates what
// comes in for the guest's ports to the target pod first, and its removal leaves the
// masquerade's table as it was.
func TestForwardIsATableOfItsOwnAndGoesWhole(t *testing.T) {
	ns := podNamespace(t)
	plan := Plan{Binding: Masquerade, Ports: []PortRule{{Protocol: "TCP", Port: 8080}, {Protocol: "UDP", Port: 53}}, TapOwner: 107, GuestMAC: guestMAC}
	if _, err := Setup(ns, plan); err != nil {
		t.Fatal(err)
	}
	c, err := nftables.New(nftables.WithNetNSFd(int(ns.Fd())))
	if err != nil {
		t.Fatal(err)
	}
	rulesIn := func(table, chain string) int {
		t.Helper()
		tb := &nftables.Table{Family: nftables.TableFamilyIPv4, Name: table}
		rules, err := c.GetRules(tb, &nftables.Chain{Name: chain, Table: tb})
		if err != nil {
			t.Fatalf("reading %s/%s: %v", table, chain, err)
		}
		return len(rules)
	}
	masquerade := rulesIn(natTable, "prerouting")

	f := Forward{Target: netip.MustParseAddr("10.244.7.9"), Ports: plan.Ports}
	for range 2 { // twice: an agent that retries finds its table and replaces it
		if err := StartForward(ns, f); err != nil {
			t.Fatal(err)
		}
	}
	if got := rulesIn(handoverTable, "prerouting"); got != len(plan.Ports) {
		t.Errorf("the forward translates %d ports, want %d", got, len(plan.Ports))
	}
	if got := rulesIn(handoverTable, "postrouting"); got != 1 {
		t.Errorf("the forward has %d rules masquerading towards the target, want 1", got)
	}
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyIPv4)
	if err != nil {
		t.Fatal(err)
	}
	prio := map[string]int32{}
	for _, ch := range chains {
		if ch.Hooknum != nil && *ch.Hooknum == *nftables.ChainHookPrerouting {
			prio[ch.Table.Name] = int32(*ch.Priority)
		}
	}
	if prio[handoverTable] >= prio[natTable] {
		t.Errorf("the forward's prerouting priority %d does not come before the masquerade's %d", prio[handoverTable], prio[natTable])
	}
	if got := rulesIn(natTable, "prerouting"); got != masquerade {
		t.Errorf("the masquerade's table has %d rules after the forward, had %d", got, masquerade)
	}

	for range 2 { // removing what is gone already is done
		if err := StopForward(ns); err != nil {
			t.Fatal(err)
		}
	}
	if tb, err := c.ListTableOfFamily(handoverTable, nftables.TableFamilyIPv4); err == nil && tb != nil {
		t.Errorf("the forward's table is still there")
	}
	if got := rulesIn(natTable, "prerouting"); got != masquerade {
		t.Errorf("the masquerade's table has %d rules after the forward went, had %d", got, masquerade)
	}
}

func TestForwardRefusesWhatItCannotDo(t *testing.T) {
	ns := podNamespace(t)
	if err := StartForward(ns, Forward{Target: netip.MustParseAddr("fd00::5")}); err == nil {
		t.Error("an IPv6 target was accepted")
	}
	self, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	defer self.Close()
	if err := StartForward(self, Forward{Target: netip.MustParseAddr("10.244.7.9")}); err == nil {
		t.Error("the node's own namespace was accepted")
	}
}
