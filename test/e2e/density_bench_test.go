package e2e

import (
	"bufio"
	"cmp"
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/test/guest"
	"github.com/lifeboat-vm/lifeboat/test/node"
)

// densityVMs idle guests of densityMemory share one emulated node in each run.
const (
	densityVMs    = 4
	densityMemory = "256Mi"
)

// BenchmarkDensity measures what a VM costs its node beyond the guest's own memory (issue 22):
// densityVMs idle guests on one node, for 1 and 2 vCPUs, and per VM the resident memory of its
// launcher, of its libvirtd and of QEMU less the guest RAM it touched (QEMU's RSS minus the RSS of
// its guest RAM mapping), and their sum as RSS, as PSS (shared pages, such as QEMU's and
// libvirt's code, divided among the processes that map them) and as USS (the pages only the VM's
// processes hold: what one more VM adds to a node that already runs one, whose shared code is
// resident once however many VMs map it). Each figure is the median over the node's VMs; run with -count for several runs and
// read them with benchstat.
//
// It runs under TCG (accel=tcg), whose QEMU holds a translated-code cache, and under KVM
// (accel=kvm) where /dev/kvm opens, which has none. Under KVM it measures once every QEMU's memory
// has settled rather than once the guest has booted: under this machine's nested KVM a Linux
// guest stops in its kernel's decompressor (docs/e2e.md), and the log says whether it booted.
func BenchmarkDensity(b *testing.B) {
	for _, accel := range []string{"tcg", "kvm"} {
		for _, cpus := range []int32{1, 2} {
			b.Run(fmt.Sprintf("accel=%s/vcpus=%d", accel, cpus), func(b *testing.B) {
				benchmarkDensity(b, accel, cpus)
			})
		}
	}
}

func benchmarkDensity(b *testing.B, accel string, cpus int32) {
	configure := func(*node.Config) {}
	if accel == "kvm" {
		configure = withKVM(b)
	}
	setConfig(b, false)
	startController(b, "--acceleration", accel)
	n := startNodes(b, 1, configure)[0]
	ns := testNamespace(b)
	b.Cleanup(func() { deleteNamespace(b, ns) })
	vmis := make([]*v1alpha1.VirtualMachineInstance, densityVMs)
	for i := range vmis {
		vmis[i] = createVMI(b, ns, newVMI(fmt.Sprintf("dense-%d", i), func(v *v1alpha1.VirtualMachineInstance) {
			v.Spec.CPUs, v.Spec.Memory = cpus, resource.MustParse(densityMemory)
		}))
	}
	for i, v := range vmis {
		vmis[i] = waitVMI(b, ns, v.Name, 2*bootTimeout, "phase Running", running)
		if accel == "tcg" {
			// Booted: the guest's init writes its counter.
			waitCounterPast(b, n.consolePath(vmis[i]), 1, 2*bootTimeout)
		}
	}
	if accel == "kvm" {
		waitQEMUSettled(b, vmis)
		for _, v := range vmis {
			console, _ := os.ReadFile(n.consolePath(v))
			b.Logf("%s under KVM: guest counter %d (0: its Linux did not boot)", v.Name, guest.Counter(string(console)))
		}
	}
	var launcher, libvirtd, qemu, total []mem
	for b.Loop() {
		for _, v := range vmis {
			o := measureOverhead(b, v)
			launcher, libvirtd, qemu = append(launcher, o.launcher), append(libvirtd, o.libvirtd), append(qemu, o.qemu)
			total = append(total, o.total())
		}
	}
	logQEMUPrivate(b, qemuPID(b, vmis[0]))
	rss := func(m mem) float64 { return m.rss }
	uss := func(m mem) float64 { return m.uss }
	b.ReportMetric(medianOf(launcher, rss), "launcher-MiB/VM")
	b.ReportMetric(medianOf(libvirtd, rss), "libvirtd-MiB/VM")
	b.ReportMetric(medianOf(qemu, rss), "qemu-overhead-MiB/VM")
	b.ReportMetric(medianOf(total, rss), "overhead-MiB/VM")
	b.ReportMetric(medianOf(total, func(m mem) float64 { return m.pss }), "overhead-PSS-MiB/VM")
	b.ReportMetric(medianOf(launcher, uss), "launcher-USS-MiB/VM")
	b.ReportMetric(medianOf(libvirtd, uss), "libvirtd-USS-MiB/VM")
	b.ReportMetric(medianOf(qemu, uss), "qemu-overhead-USS-MiB/VM")
	b.ReportMetric(medianOf(total, uss), "overhead-USS-MiB/VM")
}

// waitQEMUSettled waits until the QEMUs of vmis hold, all together, within settledMiB of what
// they held settleInterval before: the VMs are past their start.
func waitQEMUSettled(b testing.TB, vmis []*v1alpha1.VirtualMachineInstance) {
	b.Helper()
	const (
		settledMiB     = 0.5
		settleInterval = 5 * time.Second
	)
	// QEMU's whole RSS, the guest's pages included: settled, the guest too has stopped touching
	// new memory.
	sum := func() float64 {
		var s float64
		for _, v := range vmis {
			s += processMem(b, qemuPID(b, v)).rss
		}
		return s
	}
	last := sum()
	err := wait.PollUntilContextTimeout(context.Background(), settleInterval, 2*bootTimeout, false, func(context.Context) (bool, error) {
		now := sum()
		settled := math.Abs(now-last) < settledMiB
		last = now
		return settled, nil
	})
	if err != nil {
		b.Fatalf("the VMs' QEMUs did not settle within %s: want two readings %s apart within %.1f MiB, last %.1f MiB: %v",
			2*bootTimeout, settleInterval, settledMiB, last, err)
	}
}

// overhead is what a VM's pod holds besides the guest's RAM: its launcher, its libvirtd, and QEMU
// less the guest RAM it touched (QEMU's RSS minus the RSS of its guest RAM mapping).
type overhead struct{ launcher, libvirtd, qemu mem }

func (o overhead) total() mem { return o.launcher.plus(o.libvirtd).plus(o.qemu) }

// measureOverhead reads the overhead of v's pod from /proc.
func measureOverhead(b testing.TB, v *v1alpha1.VirtualMachineInstance) overhead {
	b.Helper()
	pod := launcherPod(b, v)
	qp := qemuPID(b, v)
	q, guest := processMem(b, qp), guestMem(b, qp, v.Spec.Memory)
	return overhead{
		launcher: processMem(b, podProcess(pod, "lifeboat-launcher")),
		libvirtd: processMem(b, podProcess(pod, "libvirtd")),
		qemu:     mem{q.rss - guest.rss, q.pss - guest.pss, q.uss - guest.uss},
	}
}

// mem is a process's (or a mapping's) resident memory in MiB: RSS; PSS, which divides shared
// pages among the processes that map them; and USS, the pages no other process maps.
type mem struct{ rss, pss, uss float64 }

func (m mem) plus(o mem) mem { return mem{m.rss + o.rss, m.pss + o.pss, m.uss + o.uss} }

// readMem reads a mem from smaps lines (one mapping's, or smaps_rollup's) until it has read
// Rss, Pss, Private_Clean and Private_Dirty; ok says whether all four were there.
func readMem(sc *bufio.Scanner) (m mem, ok bool) {
	var found int
	for sc.Scan() {
		line := sc.Text()
		for _, f := range []struct {
			name string
			add  *float64
		}{{"Rss:", &m.rss}, {"Pss:", &m.pss}, {"Private_Clean:", &m.uss}, {"Private_Dirty:", &m.uss}} {
			if kb, ok := smapsKiB(line, f.name); ok {
				*f.add += mib(kb)
				found++
			}
		}
		if found == 4 {
			return m, true
		}
	}
	return m, false
}

// processMem reads a process's memory from /proc/<pid>/smaps_rollup.
func processMem(b testing.TB, pid int) mem {
	b.Helper()
	if pid == 0 {
		b.Fatal("a process of the VM's pod is missing")
	}
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	m, ok := readMem(bufio.NewScanner(f))
	if !ok {
		b.Fatalf("/proc/%d/smaps_rollup lacks one of Rss, Pss, Private_Clean and Private_Dirty", pid)
	}
	return m
}

// mapping is one mapping of a process's /proc/<pid>/smaps.
type mapping struct {
	start, end  uint64 // its addresses
	perms, name string // "anonymous" for a mapping without a name
	sizeKiB     int64
	mem
}

// mappings reads every mapping of process pid from /proc/<pid>/smaps.
func mappings(b testing.TB, pid int) []mapping {
	b.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps", pid))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	var all []mapping
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// A mapping's header: address range, permissions, offset, device, inode, name; its Size
		// line comes next, then the lines readMem reads.
		header := strings.Fields(sc.Text())
		if len(header) < 5 || !strings.Contains(header[0], "-") || !sc.Scan() {
			continue
		}
		m := mapping{perms: header[1], name: "anonymous"}
		if _, err := fmt.Sscanf(header[0], "%x-%x", &m.start, &m.end); err != nil {
			b.Fatalf("/proc/%d/smaps: mapping %q: %v", pid, header[0], err)
		}
		if len(header) > 5 {
			m.name = header[5]
		}
		m.sizeKiB, _ = smapsKiB(sc.Text(), "Size:")
		var ok bool
		if m.mem, ok = readMem(sc); !ok {
			b.Fatalf("/proc/%d/smaps: mapping %s lacks one of Rss, Pss, Private_Clean and Private_Dirty", pid, header[0])
		}
		all = append(all, m)
	}
	if err := sc.Err(); err != nil {
		b.Fatal(err)
	}
	return all
}

// guestMem reads QEMU's guest RAM mapping from /proc/<pid>/smaps: the mapping whose size is the
// guest's memory (libvirt's memory-backend-ram "pc.ram"), or adjacent anonymous mappings that
// together are, since the kernel splits a mapping whose parts get different advice.
func guestMem(b testing.TB, pid int, memory resource.Quantity) mem {
	b.Helper()
	m, err := findGuestMem(mappings(b, pid), memory)
	if err != nil {
		b.Fatalf("QEMU %d: %v", pid, err)
	}
	return m
}

func findGuestMem(all []mapping, memory resource.Quantity) (mem, error) {
	guestKB := memory.Value() / 1024
	for i := range all {
		var sum mem
		var kb int64
		for j := i; j < len(all) && all[j].name == all[i].name && (j == i || all[j].start == all[j-1].end); j++ {
			sum, kb = sum.plus(all[j].mem), kb+all[j].sizeKiB
			if kb == guestKB {
				return sum, nil
			}
			if kb > guestKB {
				break
			}
		}
	}
	var large []string
	for _, m := range all {
		if m.sizeKiB >= 1024 {
			large = append(large, fmt.Sprintf("%x-%x %s %s %.1f MiB", m.start, m.end, m.perms, m.name, mib(m.sizeKiB)))
		}
	}
	return mem{}, fmt.Errorf("no mapping of the guest's %s; its mappings of 1 MiB or more:\n%s", memory.String(), strings.Join(large, "\n"))
}

// logQEMUPrivate logs where a QEMU's own pages (its USS) are: each mapping holding at least
// 1 MiB of them, with its permissions and size, the largest first. Under TCG the
// translated-code cache is the large anonymous rwx reservation.
func logQEMUPrivate(b testing.TB, pid int) {
	b.Helper()
	own := slices.DeleteFunc(mappings(b, pid), func(m mapping) bool { return m.uss < 1 })
	slices.SortFunc(own, func(x, y mapping) int { return cmp.Compare(y.uss, x.uss) })
	lines := make([]string, len(own))
	for i, m := range own {
		lines[i] = fmt.Sprintf("%7.1f MiB own of %9.1f MiB mapped, %s %s", m.uss, mib(m.sizeKiB), m.perms, m.name)
	}
	b.Logf("QEMU %d: its mappings holding 1 MiB or more of its own pages:\n%s", pid, strings.Join(lines, "\n"))
}

// smapsKiB reads a "Name: N kB" line of an smaps file.
func smapsKiB(line, name string) (int64, bool) {
	fields := strings.Fields(line)
	if len(fields) < 2 || fields[0] != name {
		return 0, false
	}
	kb, err := strconv.ParseInt(fields[1], 10, 64)
	return kb, err == nil
}

func mib(kb int64) float64 { return float64(kb) / 1024 }

// qemuPID finds the VM's QEMU by the guest name libvirt gives it (namespace_name).
func qemuPID(b testing.TB, v *v1alpha1.VirtualMachineInstance) int {
	b.Helper()
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err == nil && isQEMUOf(pid, v.Namespace, v.Name) {
			return pid
		}
	}
	b.Fatalf("no QEMU for %s/%s", v.Namespace, v.Name)
	return 0
}

// isQEMUOf says whether process pid is the QEMU of VM ns/name, by the guest name libvirt gives
// it (namespace_name).
func isQEMUOf(pid int, ns, name string) bool {
	want := "guest=" + ns + "_" + name
	exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	if !strings.HasPrefix(filepath.Base(exe), "qemu-system") {
		return false
	}
	cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	for _, arg := range strings.Split(string(cmdline), "\x00") {
		if arg == want || strings.HasPrefix(arg, want+",") {
			return true
		}
	}
	return false
}

// medianOf is the median of one figure of ms.
func medianOf(ms []mem, figure func(mem) float64) float64 {
	xs := make([]float64, len(ms))
	for i, m := range ms {
		xs[i] = figure(m)
	}
	return median(xs)
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// TestTheLauncherPodAsksForWhatItUses: the launcher pod's memory request is the guest's memory
// plus an overhead computed per term (fixed, per vCPU, per GiB of guest memory: vmi.MemoryRequest),
// and that overhead covers what the pod really holds besides the guest's RAM, measured as
// BenchmarkDensity measures it (RSS of the launcher, its libvirtd, and QEMU less its guest RAM),
// with at most overheadMargin to spare: the kubelet's eviction manager ranks pods by their usage
// above their requests, so a request below the truth makes a VM the first pod evicted, and one far
// above it wastes the node. Three VMs, so that each term is exercised: 1 and 2 vCPUs at 256 MiB,
// and 1 vCPU at 1 GiB.
func TestTheLauncherPodAsksForWhatItUses(t *testing.T) {
	const overheadMargin = 24.0 // MiB
	setConfig(t, false)
	startController(t)
	n := startNodes(t, 1)[0]
	ns := testNamespace(t)
	shapes := []struct {
		cpus   int32
		memory string
	}{{1, "256Mi"}, {2, "256Mi"}, {1, "1Gi"}}
	vmis := make([]*v1alpha1.VirtualMachineInstance, len(shapes))
	for i, s := range shapes {
		vmis[i] = createVMI(t, ns, newVMI(fmt.Sprintf("sized-%d", i), func(v *v1alpha1.VirtualMachineInstance) {
			v.Spec.CPUs, v.Spec.Memory = s.cpus, resource.MustParse(s.memory)
		}))
	}
	for i, v := range vmis {
		v = waitVMI(t, ns, v.Name, 2*bootTimeout, "phase Running", running)
		waitCounterPast(t, n.consolePath(v), 1, 2*bootTimeout)
		used := measureOverhead(t, v).total().rss
		request := launcherPod(t, v).Spec.Containers[0].Resources.Requests[corev1.ResourceMemory]
		asked := float64(request.Value()-v.Spec.Memory.Value()) / (1 << 20)
		t.Logf("%d vCPU, %s: the pod asks for %.1f MiB beyond the guest's memory and holds %.1f MiB (launcher, libvirtd, QEMU less guest RAM)",
			shapes[i].cpus, shapes[i].memory, asked, used)
		if asked < used || asked > used+overheadMargin {
			t.Errorf("%d vCPU, %s: the pod asks for %.1f MiB beyond the guest's memory, holds %.1f MiB; want between what it holds and %.0f MiB more",
				shapes[i].cpus, shapes[i].memory, asked, used, overheadMargin)
		}
	}
}
