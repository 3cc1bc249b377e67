package agent

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/sys/unix"
)

func TestGuestFilterDropsAreServedByVMUntilItsPodGoes(t *testing.T) {
	g := newGuestFilterDrops()
	// A character device stands in for a pod whose filter dropped 3 spoofed frames and 1
	// unsupported one; a regular file for a pod whose counters cannot be read.
	g.read = func(ns int) (uint64, uint64, error) {
		var st unix.Stat_t
		if err := unix.Fstat(ns, &st); err != nil {
			return 0, 0, err
		}
		if st.Mode&unix.S_IFMT == unix.S_IFCHR {
			return 3, 1, nil
		}
		return 0, 0, errors.New("no such table")
	}
	open := func(path string) *os.File {
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		// watch keeps its own descriptor: the caller's is closed once it returns.
		t.Cleanup(func() { f.Close() })
		return f
	}
	for _, w := range []struct{ uid, name, path string }{
		{"uid-a", "a", os.DevNull},
		{"uid-a", "a", os.DevNull}, // built again: replaces, does not add
		{"uid-b", "b", filepath.Join(t.TempDir(), "not-a-namespace")},
	} {
		if err := g.watch(w.uid, "tenant", w.name, open(w.path)); err != nil {
			t.Fatal(err)
		}
	}
	want := `
# HELP lifeboat_agent_guest_frames_dropped_total Frames a VM's guest sent that the filter in its launcher pod dropped, by reason: spoofed (a source MAC or IPv4 address, or an ARP sender, not the guest's) or unsupported (IPv6, VLAN-tagged, neither IPv4 nor ARP). From 0 each time the pod network is built.
# TYPE lifeboat_agent_guest_frames_dropped_total counter
lifeboat_agent_guest_frames_dropped_total{namespace="tenant",reason="spoofed",vmi="a"} 3
lifeboat_agent_guest_frames_dropped_total{namespace="tenant",reason="unsupported",vmi="a"} 1
`
	if err := testutil.CollectAndCompare(g, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
	g.forget("uid-a")
	g.forget("uid-b")
	if n := testutil.CollectAndCount(g); n != 0 || len(g.byUID) != 0 {
		t.Errorf("after both pods went, %d series and %d namespaces kept; want none", n, len(g.byUID))
	}
}
