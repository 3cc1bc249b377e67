package soak

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"

	contract "github.com/lifeboat-vm/lifeboat/api/launcher"
	"github.com/lifeboat-vm/lifeboat/test/guest/protocol"
)

// Reading is one reading of a guest's console log on a node.
type Reading struct {
	// Instance is the VMI's UID.
	Instance string
	// Stream names the console log read: the node, the instance and the launcher pod whose log it is.
	Stream string
	// Counter, Through and Errs are what ParseConsole found in it.
	Counter, Through int
	Errs             []string
}

// ReadConsole reads the console log in dir, a node's DomainsDir/<vmi-uid>: the agent's link to
// the run volume of the launcher pod it chose for the VMI. The link moves: once the VM is
// stopped and its pod deleted, the agent links an older pod of the instance still on the node
// (a migration's target that the guest left since), whose log stopped where the guest left it.
// So the link is resolved once, the log read from its target, and the reading named by that
// pod: read again, an old pod's log shows what it showed before, not a counter going back.
//
// The link's target is a path as the agent sees it. mounts maps a directory as an agent in a
// pod sees it (its hostPath volume's mount path) to where that directory is on this machine;
// nil for an agent that runs on this machine's own paths.
func ReadConsole(node, dir string, mounts map[string]string) (Reading, error) {
	volume, err := resolveLink(dir, mounts)
	if err != nil {
		return Reading{}, err
	}
	b, err := os.ReadFile(filepath.Join(volume, contract.ConsoleLog))
	if err != nil {
		return Reading{}, err
	}
	instance := filepath.Base(dir)
	r := Reading{Instance: instance, Stream: node + "/" + instance + "/" + podOfRunVolume(volume)}
	r.Counter, r.Through, r.Errs = ParseConsole(string(b))
	return r, nil
}

// resolveLink is where the link dir points on this machine, its target's mount path, as the
// agent saw it, replaced by the directory mounts maps it to.
func resolveLink(dir string, mounts map[string]string) (string, error) {
	target, err := os.Readlink(dir)
	if err != nil {
		// Not a link: the directory itself.
		return filepath.EvalSymlinks(dir)
	}
	for inPod, onHost := range mounts {
		if rest, ok := strings.CutPrefix(target, inPod+"/"); ok {
			target = filepath.Join(onHost, rest)
			break
		}
	}
	if !filepath.IsAbs(target) {
		target = filepath.Join(filepath.Dir(dir), target)
	}
	return filepath.EvalSymlinks(target)
}

// podOfRunVolume is the UID of the pod whose run volume is at path (the kubelet's
// pods/<uid>/volumes/kubernetes.io~empty-dir/run), or path itself if it is not one.
func podOfRunVolume(path string) string {
	emptyDirs := filepath.Dir(path)
	volumes := filepath.Dir(emptyDirs)
	if filepath.Base(path) != contract.RunVolume || filepath.Base(emptyDirs) != "kubernetes.io~empty-dir" || filepath.Base(volumes) != "volumes" {
		return path
	}
	return filepath.Base(filepath.Dir(volumes))
}

// ParseConsole reads a console log: its last counter line (a reboot shows as the counter going
// back), the longest journal it said was intact, and its disk error lines up to the guest's power
// button: once the guest powers off, a journal write racing its kernel's shutdown fails (EIO), and
// that write was never committed. A last line without its newline is still being written (QEMU
// writes the guest's serial output as it comes, a byte at a time under load): it is left for the
// next reading, where "counter 12" of a guest writing 121 would read as a reboot.
func ParseConsole(console string) (counter, through int, errs []string) {
	complete := console[:strings.LastIndexByte(console, '\n')+1]
	lines := strings.Split(strings.ReplaceAll(complete, "\r\n", "\n"), "\n")
	poweringOff := false
	for _, line := range lines {
		if n, ok := strings.CutPrefix(line, protocol.CounterPrefix); ok {
			if v, err := strconv.Atoi(n); err == nil {
				counter = v
			}
			continue
		}
		if rest, ok := strings.CutPrefix(line, protocol.DiskPrefix); ok {
			if _, journal, ok := strings.Cut(rest, ": journal 1.."); ok {
				if v, err := strconv.Atoi(strings.TrimSuffix(journal, " intact")); err == nil {
					through = v
				}
			}
			continue
		}
		if strings.TrimRight(line, "\r") == protocol.PowerButton {
			poweringOff = true
		}
		if rest, ok := strings.CutPrefix(line, protocol.ErrorPrefix); ok && strings.HasPrefix(rest, "disk ") && !poweringOff {
			errs = append(errs, rest)
		}
	}
	return counter, through, errs
}
