package soak

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	contract "github.com/lifeboat-vm/lifeboat/api/launcher"
	"github.com/lifeboat-vm/lifeboat/test/guest/protocol"
	"github.com/lifeboat-vm/lifeboat/test/soak/check"
)

func TestParseConsole(t *testing.T) {
	for _, tc := range []struct {
		name          string
		console       string
		counter, jrnl int
		errs          string
	}{
		{"nothing yet", "", 0, 0, "[]"},
		{"counting with a journal", "lifeboat-guest ready\r\nlifeboat-guest counter 1\r\nlifeboat-guest counter 2\r\n" +
			protocol.Journal("vda", 5) + "\r\nlifeboat-guest counter 6\r\n", 6, 5, "[]"},
		{"a reboot shows as the last counter going back", "lifeboat-guest counter 41\r\nlifeboat-guest counter 1\r\n", 1, 0, "[]"},
		{"a line still being written is not read", "lifeboat-guest counter 120\r\nlifeboat-guest counter 12", 120, 0, "[]"},
		{"nor a line whose newline has not come", "lifeboat-guest counter 120\r\nlifeboat-guest counter 121\r", 120, 0, "[]"},
		{"nor a partial error line", "lifeboat-guest counter 3\r\n" + protocol.ErrorPrefix + "disk vda: journal ent", 3, 0, "[]"},
		{"a journal error", "lifeboat-guest counter 3\r\n" + protocol.ErrorPrefix + "disk vda: journal entry 2 holds 0, want 2\r\n", 3,
			0, "[disk vda: journal entry 2 holds 0, want 2]"},
		{"an error that is not the disk's", protocol.ErrorPrefix + "network: no DHCP answer\r\n", 0, 0, "[]"},
		{"a write racing the guest's own power-off is no loss", "lifeboat-guest counter 3\r\n" + protocol.PowerButton + "\r\n" +
			protocol.ErrorPrefix + "disk vda: write /dev/vda: input/output error\r\n", 3, 0, "[]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			counter, jrnl, errs := ParseConsole(tc.console)
			if counter != tc.counter || jrnl != tc.jrnl || fmt.Sprint(errs) != tc.errs {
				t.Errorf("got counter %d, journal %d, errors %v; want %d, %d, %s", counter, jrnl, errs, tc.counter, tc.jrnl, tc.errs)
			}
		})
	}
}

// node is a node's directories as the soak reads them: the kubelet's pod directories, each
// launcher pod's run volume holding its guest's console log, and the agent's DomainsDir, whose
// <vmi-uid> links to the run volume of the pod the agent chose for the VMI.
type node struct {
	t          *testing.T
	name, root string
	readings   []check.Console
	at         time.Time
}

func newNode(t *testing.T, name string) *node {
	n := &node{t: t, name: name, root: t.TempDir(), at: time.Date(2026, 11, 28, 9, 25, 54, 0, time.UTC)}
	if err := os.MkdirAll(filepath.Join(n.root, "domains"), 0o755); err != nil {
		t.Fatal(err)
	}
	return n
}

// console has pod's guest print counters from to to on its console.
func (n *node) console(pod string, from, to int) {
	dir := filepath.Join(n.root, "pods", pod, "volumes", "kubernetes.io~empty-dir", contract.RunVolume)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		n.t.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(dir, contract.ConsoleLog), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		n.t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	for i := from; i <= to; i++ {
		if _, err := fmt.Fprintf(f, "%s\r\n", protocol.Counter(i)); err != nil {
			n.t.Fatal(err)
		}
	}
}

// link has the agent link the instance's directory to pod's run volume, as it does: in one rename.
func (n *node) link(instance, pod string) {
	tmp := filepath.Join(n.root, ".link-"+instance)
	if err := os.Symlink(filepath.Join(n.root, "pods", pod, "volumes", "kubernetes.io~empty-dir", contract.RunVolume), tmp); err != nil {
		n.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(n.root, "domains", instance)); err != nil {
		n.t.Fatal(err)
	}
}

// read reads the instance's console as the soak does, a second after the last reading.
func (n *node) read(instance string) {
	n.at = n.at.Add(time.Second)
	r, err := ReadConsole(n.name, filepath.Join(n.root, "domains", instance), nil)
	if err != nil {
		n.t.Fatal(err)
	}
	if r.Instance != instance {
		n.t.Fatalf("read instance %s's console as instance %s's", instance, r.Instance)
	}
	n.readings = append(n.readings, check.Console{At: n.at, VM: "ns/a", Instance: r.Instance, Node: n.name, Stream: r.Stream, Counter: r.Counter})
}

// A guest's instance leaves a node by migration and comes back to it in a new pod; the old pod
// stays until it is deleted. When the owner stops the VM and the new pod goes, the agent links
// the instance's directory to the old pod again, whose console stopped where the guest left it:
// read through the link, the counter seemed to go back (seed 12's two Reboot violations). Each
// pod's console is a stream of its own, so that an old one read again is no reboot, while a
// guest that boots again in its pod, or arrives in a new pod with an older count, still is.
func TestAConsoleLinkMovedBackToAnOldPodIsNoReboot(t *testing.T) {
	for _, tc := range []struct {
		name string
		// then is what happens after the old pod is linked again; nil for nothing.
		then func(n *node)
		want string // the violation the checker must find; empty for none
	}{
		{name: "the old pod's console read again"},
		{name: "the new pod's guest boots again in it", want: "went back from 427 to 1", then: func(n *node) {
			n.console("pod-b", 1, 1)
			n.link("i1", "pod-b")
			n.read("i1")
		}},
		{name: "the guest arrives in a third pod with an older count", want: "new console on n3 starts at 201 after it had counted to 427",
			then: func(n *node) {
				n.console("pod-c", 200, 201)
				n.link("i1", "pod-c")
				n.read("i1")
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newNode(t, "n3")
			n.console("pod-a", 1, 250)
			n.link("i1", "pod-a")
			n.read("i1")
			n.console("pod-a", 251, 256)
			n.read("i1")
			// The guest left pod-a by migration and came back in pod-b.
			n.console("pod-b", 300, 420)
			n.link("i1", "pod-b")
			n.read("i1")
			n.console("pod-b", 421, 427)
			n.read("i1")
			// The owner stopped the VM: pod-b is deleted, and the agent links pod-a again.
			n.link("i1", "pod-a")
			n.read("i1")
			if tc.then != nil {
				tc.then(n)
			}
			var reboots []string
			for _, v := range check.Check(check.History{Consoles: n.readings}, check.DefaultLimits()) {
				reboots = append(reboots, v.String())
			}
			switch {
			case tc.want == "" && len(reboots) > 0:
				t.Errorf("violations: %v; want none", reboots)
			case tc.want != "" && (len(reboots) != 1 || !strings.Contains(reboots[0], string(check.Reboot)) || !strings.Contains(reboots[0], tc.want)):
				t.Errorf("violations: %v; want one Reboot saying %q", reboots, tc.want)
			}
		})
	}
}

// An agent in a pod (the real node's) links to the run volume as it sees it, under its
// kubelet-pods hostPath's mount path; read with that mount mapped to the node's pods directory,
// the console is the pod's, named by the pod, as an emulated node's is.
func TestAConsoleLinkedFromInsideAnAgentPodIsReadThroughItsMount(t *testing.T) {
	n := newNode(t, "real-1")
	n.console("pod-a", 1, 7)
	const inPod = "/var/lib/kubelet/pods"
	link := filepath.Join(n.root, "domains", "i1")
	if err := os.Symlink(filepath.Join(inPod, "pod-a", "volumes", "kubernetes.io~empty-dir", contract.RunVolume), link); err != nil {
		t.Fatal(err)
	}
	r, err := ReadConsole(n.name, link, map[string]string{inPod: filepath.Join(n.root, "pods")})
	if err != nil {
		t.Fatal(err)
	}
	if r.Instance != "i1" || r.Stream != "real-1/i1/pod-a" || r.Counter != 7 {
		t.Errorf("read %+v; want instance i1, stream real-1/i1/pod-a, counter 7", r)
	}
	if _, err := ReadConsole(n.name, link, nil); err == nil {
		t.Errorf("read through the agent's own path, which this machine does not have, it must fail")
	}
}
