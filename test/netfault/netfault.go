// Package netfault cuts or slows, for a while, the TCP traffic that chosen processes send to
// chosen loopback addresses: the network between two emulated nodes, whose agents carry their
// migrations' streams to each other's node address. Emulated nodes share the machine's loopback
// device, and other test processes may use the same addresses at the same time, so a rule never
// matches an address alone: it matches the sockets of the processes put in one of its groups (a
// cgroup v2 of its own, which the nftables rule names by `socket cgroupv2`) sending to a peer's
// address. The rules live in an nftables table of their own, removed by Close.
package netfault

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// Faults is one process's table of network faults and its groups of processes.
type Faults struct {
	name  string // the nftables table's name and the cgroup under the cgroup v2 root
	mount string // the cgroup v2 hierarchy's mount point
	table *nftables.Table
	chain *nftables.Chain

	mu sync.Mutex
	// home is where each process Join moved came from, to put it back on Close; groupHome is
	// where the first of each group came from, for the processes they started since (which
	// start in their parent's group).
	home      map[int]string
	groupHome map[string]string
}

// Prefix starts the name of every table and cgroup of this package: Sweep finds them by it.
const Prefix = "lifeboat-netfault-"

// New makes the process's table and cgroup, both named Prefix and its pid.
func New() (*Faults, error) {
	mount, err := cgroup2Mount()
	if err != nil {
		return nil, err
	}
	f := &Faults{name: Prefix + strconv.Itoa(os.Getpid()), mount: mount, home: map[int]string{}, groupHome: map[string]string{}}
	if err := os.Mkdir(filepath.Join(mount, f.name), 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("making cgroup %s: %w", f.name, err)
	}
	c, err := nftables.New()
	if err != nil {
		return nil, err
	}
	f.table = c.AddTable(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: f.name})
	accept := nftables.ChainPolicyAccept
	f.chain = c.AddChain(&nftables.Chain{Name: "output", Table: f.table, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	if err := c.Flush(); err != nil {
		_ = os.Remove(filepath.Join(mount, f.name))
		return nil, fmt.Errorf("making nftables table %s: %w", f.name, err)
	}
	return f, nil
}

// cgroup2Mount is where the cgroup v2 hierarchy is: /sys/fs/cgroup on a unified system,
// /sys/fs/cgroup/unified on a hybrid one.
func cgroup2Mount() (string, error) {
	for _, dir := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified"} {
		var st unix.Statfs_t
		if unix.Statfs(dir, &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC {
			return dir, nil
		}
	}
	return "", errors.New("no cgroup v2 hierarchy at /sys/fs/cgroup or /sys/fs/cgroup/unified")
}

// Join puts process pid in group: its sockets created from now on are the group's.
func (f *Faults) Join(group string, pid int) error {
	home, err := cgroupOf(pid)
	if err != nil {
		return err
	}
	dir := filepath.Join(f.mount, f.name, group)
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("making cgroup %s: %w", dir, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644); err != nil {
		return fmt.Errorf("moving process %d into %s: %w", pid, dir, err)
	}
	f.mu.Lock()
	if _, ok := f.home[pid]; !ok {
		f.home[pid] = home
	}
	if _, ok := f.groupHome[group]; !ok {
		f.groupHome[group] = home
	}
	f.mu.Unlock()
	return nil
}

// cgroupOf is process pid's cgroup v2 path ("0::/path" in /proc/pid/cgroup).
func cgroupOf(pid int) (string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if path, ok := strings.CutPrefix(line, "0::"); ok {
			return path, nil
		}
	}
	return "", fmt.Errorf("process %d has no cgroup v2 path", pid)
}

// Cut drops every packet group's processes send to each address in to.
func (f *Faults) Cut(group string, to ...netip.Addr) error {
	return f.add(group, to, &expr.Verdict{Kind: expr.VerdictDrop})
}

// Slow drops what group's processes send to each address in to beyond bytesPerSecond (for
// each address): TCP backs off to a rate of that order (on loopback, measured, up to twice it:
// its retransmissions and large segments round the policer).
func (f *Faults) Slow(group string, bytesPerSecond uint64, to ...netip.Addr) error {
	return f.add(group, to,
		&expr.Limit{Type: expr.LimitTypePktBytes, Rate: bytesPerSecond, Unit: expr.LimitTimeSecond, Over: true, Burst: 64 << 10},
		&expr.Verdict{Kind: expr.VerdictDrop})
}

func (f *Faults) add(group string, to []netip.Addr, then ...expr.Any) error {
	id, err := f.cgroupID(group)
	if err != nil {
		return err
	}
	c, err := nftables.New()
	if err != nil {
		return err
	}
	for _, addr := range to {
		c.AddRule(&nftables.Rule{Table: f.table, Chain: f.chain, Exprs: Rule(id, addr, then...)})
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("adding the rules of group %s to %v: %w", group, to, err)
	}
	return nil
}

// Rule is the rule for the sockets of the cgroup v2 of id at level 2 (Prefix+name/group)
// sending IPv4 to addr: then.
func Rule(id uint64, addr netip.Addr, then ...expr.Any) []expr.Any {
	cgroup := make([]byte, 8)
	binary.NativeEndian.PutUint64(cgroup, id)
	return append([]expr.Any{
		&expr.Socket{Key: expr.SocketKeyCgroupv2, Level: 2, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: cgroup},
		// The destination address: 4 bytes at offset 16 of the IPv4 header.
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: addr.AsSlice()},
	}, then...)
}

// cgroupID is the id nftables knows group's cgroup by: its directory's inode number.
func (f *Faults) cgroupID(group string) (uint64, error) {
	var st unix.Stat_t
	dir := filepath.Join(f.mount, f.name, group)
	if err := unix.Stat(dir, &st); err != nil {
		return 0, fmt.Errorf("group %s: %w", group, err)
	}
	return st.Ino, nil
}

// Heal removes every rule: the network is whole again.
func (f *Faults) Heal() error {
	c, err := nftables.New()
	if err != nil {
		return err
	}
	c.FlushChain(f.chain)
	if err := c.Flush(); err != nil {
		return fmt.Errorf("removing the rules of table %s: %w", f.name, err)
	}
	return nil
}

// Close removes the table, puts the processes Join moved back where they were, and removes the cgroups.
func (f *Faults) Close() error {
	var errs []error
	if c, err := nftables.New(); err != nil {
		errs = append(errs, err)
	} else {
		c.DelTable(f.table)
		if err := c.Flush(); err != nil {
			errs = append(errs, fmt.Errorf("removing table %s: %w", f.name, err))
		}
	}
	f.mu.Lock()
	for pid, home := range f.home {
		// A process that ended has left its cgroup already.
		if err := os.WriteFile(filepath.Join(f.mount, home, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0o644); err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, fmt.Errorf("moving process %d back to %s: %w", pid, home, err))
		}
	}
	// What the joined processes started meanwhile (an agent's libvirt client children) goes
	// back with them.
	for group, home := range f.groupHome {
		b, err := os.ReadFile(filepath.Join(f.mount, f.name, group, "cgroup.procs"))
		if err != nil {
			continue
		}
		for _, pid := range strings.Fields(string(b)) {
			if err := os.WriteFile(filepath.Join(f.mount, home, "cgroup.procs"), []byte(pid), 0o644); err != nil && !errors.Is(err, unix.ESRCH) {
				errs = append(errs, fmt.Errorf("moving process %s, started in group %s, to %s: %w", pid, group, home, err))
			}
		}
	}
	f.mu.Unlock()
	errs = append(errs, removeCgroups(filepath.Join(f.mount, f.name)))
	return errors.Join(errs...)
}

// removeCgroups removes the cgroup dir and those below it (rmdir only: cgroup files go with their directory).
func removeCgroups(dir string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range entries {
		if e.IsDir() {
			if err := removeCgroups(filepath.Join(dir, e.Name())); err != nil {
				return err
			}
		}
	}
	if err := unix.Rmdir(dir); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("removing cgroup %s: %w", dir, err)
	}
	return nil
}

// Sweep removes the tables and cgroups of this package whose names end in the pid of a process
// that no longer runs: what a test process killed before its Close left.
func Sweep() error {
	c, err := nftables.New()
	if err != nil {
		return err
	}
	tables, err := c.ListTablesOfFamily(nftables.TableFamilyIPv4)
	if err != nil {
		return err
	}
	var errs []error
	for _, t := range tables {
		if stale(t.Name) {
			c.DelTable(t)
		}
	}
	if err := c.Flush(); err != nil {
		errs = append(errs, err)
	}
	if mount, err := cgroup2Mount(); err == nil {
		entries, _ := os.ReadDir(mount)
		for _, e := range entries {
			if e.IsDir() && stale(e.Name()) {
				errs = append(errs, removeCgroups(filepath.Join(mount, e.Name())))
			}
		}
	}
	return errors.Join(errs...)
}

// stale says name is Prefix followed by the pid of a process that no longer runs.
func stale(name string) bool {
	rest, ok := strings.CutPrefix(name, Prefix)
	if !ok {
		return false
	}
	pid, err := strconv.Atoi(rest)
	if err != nil {
		return false
	}
	return unix.Kill(pid, 0) == unix.ESRCH
}
