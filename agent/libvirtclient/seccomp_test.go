package libvirtclient

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// probeEnv, in this test binary's environment, makes it a probe of the child's filter
// (runProbes) instead of running tests.
const probeEnv = "LIFEBOAT_TEST_SECCOMP_PROBE"

func TestMain(m *testing.M) {
	if mode := os.Getenv(probeEnv); mode != "" {
		runProbeMode(mode)
	}
	os.Exit(m.Run())
}

// seccompData lays a system call out as the filter reads it. x/net/bpf's VM loads 32-bit words in
// network order and the kernel in the machine's, so each word the filter may load (the number, the
// architecture, and each argument's lower and upper half) is written in network order where the
// kernel would find it.
func seccompData(arch uint32, nr uint32, args ...uint64) []byte {
	b := make([]byte, 64)
	binary.BigEndian.PutUint32(b[offNr:], nr)
	binary.BigEndian.PutUint32(b[offArch:], arch)
	for i, a := range args {
		binary.BigEndian.PutUint32(b[offArg0Low+8*i:], uint32(a))
		binary.BigEndian.PutUint32(b[offArg0Low+8*i+4:], uint32(a>>32))
	}
	return b
}

// The filter's verdicts, run on the program as assembled for the kernel.
func TestTheChildsFilterVerdicts(t *testing.T) {
	if _, err := childFilter("mips"); err == nil {
		t.Error("a filter for an architecture it does not know; want an error, so that the child does not run unfiltered")
	}
	arch, ok := auditArch[runtime.GOARCH]
	if !ok {
		t.Fatalf("the child has no filter for %s, and so does not run there", runtime.GOARCH)
	}
	prog, err := childFilter(runtime.GOARCH)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := bpf.Assemble(prog)
	if err != nil {
		t.Fatal(err)
	}
	assembled, allDecoded := bpf.Disassemble(raw)
	if !allDecoded {
		t.Fatal("the assembled filter does not disassemble")
	}
	vm, err := bpf.NewVM(assembled)
	if err != nil {
		t.Fatalf("the filter is not a valid program: %v", err)
	}
	// The flags the Go runtime creates its threads with, and os/exec its processes.
	const goThread = unix.CLONE_VM | unix.CLONE_FS | unix.CLONE_FILES | unix.CLONE_SIGHAND | unix.CLONE_SYSVSEM | unix.CLONE_THREAD
	const glibcThread = goThread | unix.CLONE_SETTLS | unix.CLONE_PARENT_SETTID | unix.CLONE_CHILD_CLEARTID
	const goExec = unix.CLONE_VM | unix.CLONE_VFORK | unix.CLONE_PIDFD | uint64(unix.SIGCHLD)
	type call struct {
		name string
		arch uint32
		nr   uint32
		args []uint64
		want uint32
	}
	calls := []call{
		{"unshare(CLONE_NEWUSER)", arch, unix.SYS_UNSHARE, []uint64{unix.CLONE_NEWUSER}, retEPERM},
		{"unshare(0)", arch, unix.SYS_UNSHARE, []uint64{0}, retEPERM},
		{"clone3", arch, unix.SYS_CLONE3, nil, retENOSYS},
		{"clone of a Go thread", arch, unix.SYS_CLONE, []uint64{goThread}, retAllow},
		{"clone of a glibc thread", arch, unix.SYS_CLONE, []uint64{glibcThread}, retAllow},
		{"clone of os/exec", arch, unix.SYS_CLONE, []uint64{goExec}, retAllow},
		{"fork", arch, unix.SYS_CLONE, []uint64{uint64(unix.SIGCHLD)}, retAllow},
		{"clone(CLONE_NEWUSER) with bits in the upper half", arch, unix.SYS_CLONE, []uint64{0xffffffff00000000 | unix.CLONE_NEWUSER | uint64(unix.SIGCHLD)}, retEPERM},
		{"read", arch, unix.SYS_READ, []uint64{0, 0, 0}, retAllow},
		{"openat", arch, unix.SYS_OPENAT, nil, retAllow},
		{"socket", arch, unix.SYS_SOCKET, []uint64{unix.AF_UNIX, unix.SOCK_STREAM}, retAllow},
		{"connect", arch, unix.SYS_CONNECT, nil, retAllow},
		{"futex", arch, unix.SYS_FUTEX, nil, retAllow},
		{"epoll_pwait", arch, unix.SYS_EPOLL_PWAIT, nil, retAllow},
		{"prctl", arch, unix.SYS_PRCTL, nil, retAllow},
		{"exit_group", arch, unix.SYS_EXIT_GROUP, nil, retAllow},
		// unshare is 310 in i386's table, reached through int 0x80 on amd64.
		{"another architecture's unshare", unix.AUDIT_ARCH_I386, 310, []uint64{unix.CLONE_NEWUSER}, retKill},
		{"another architecture's read", unix.AUDIT_ARCH_I386, 3, nil, retKill},
	}
	for _, f := range []uint64{unix.CLONE_NEWNS, unix.CLONE_NEWCGROUP, unix.CLONE_NEWUTS, unix.CLONE_NEWIPC, unix.CLONE_NEWUSER, unix.CLONE_NEWPID, unix.CLONE_NEWNET} {
		calls = append(calls, call{fmt.Sprintf("clone(%#x)", f), arch, unix.SYS_CLONE, []uint64{f | uint64(unix.SIGCHLD)}, retEPERM})
	}
	for _, nr := range refusedSyscalls {
		calls = append(calls, call{fmt.Sprintf("system call %d", nr), arch, uint32(nr), nil, retEPERM})
	}
	if runtime.GOARCH == "amd64" {
		calls = append(calls,
			call{"x32's unshare", arch, x32SyscallBit | unix.SYS_UNSHARE, []uint64{unix.CLONE_NEWUSER}, retKill},
			call{"x32's read", arch, x32SyscallBit | unix.SYS_READ, nil, retKill})
	}
	for _, c := range calls {
		got, err := vm.Run(seccompData(c.arch, c.nr, c.args...))
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if uint32(got) != c.want {
			t.Errorf("%s: the filter returns %#x, want %#x", c.name, uint32(got), c.want)
		}
	}
}

// refusedProbes are what a probe tries that the filter refuses, with what it answers; each
// without the filter gets something else (it succeeds, or fails for a reason of its own), so that
// the refusal is the filter's.
var refusedProbes = map[string]string{
	"clone(CLONE_NEWUSER)":   "EPERM",
	"clone(CLONE_NEWNET)":    "EPERM",
	"unshare(CLONE_NEWUSER)": "EPERM",
	"unshare(CLONE_NEWNET)":  "EPERM",
	"clone3":                 "ENOSYS",
	"setns":                  "EPERM",
	"mount":                  "EPERM",
	"umount2":                "EPERM",
	"fsopen":                 "EPERM",
	"open_tree":              "EPERM",
	"chroot":                 "EPERM",
	"bpf":                    "EPERM",
	"perf_event_open":        "EPERM",
	"keyctl":                 "EPERM",
	"io_uring_setup":         "EPERM",
	"userfaultfd":            "EPERM",
	"ptrace":                 "EPERM",
}

// ordinaryProbes are what the child's work needs: they succeed with the filter as without.
var ordinaryProbes = []string{"read a file", "unix socket", "new threads", "timer", "exec"}

// The child's filter, installed as confine does in a process of its own, refuses namespaces,
// mounts and the kernel interfaces it lists, on every thread, while a Go program's ordinary work
// (files, unix sockets, new threads, timers, even starting a program) goes on.
func TestTheChildsFilterRefusesNamespacesAndMounts(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("without the filter, the probes need root to show that the refusals are the filter's: run the tests as root, as make test and .ci/run do (README, Prerequisites)")
	}
	unfiltered := probe(t, "unfiltered")
	filtered := probe(t, "filtered")
	// What the review's exploit starts with: a process in a new user namespace, which the child
	// could create before.
	if got := unfiltered["clone(CLONE_NEWUSER)"]; got != "ok" {
		t.Errorf("without the filter, clone(CLONE_NEWUSER): %s; want ok", got)
	}
	for p, want := range refusedProbes {
		if got := filtered[p]; got != want {
			t.Errorf("with the filter, %s: %s; want %s", p, got, want)
		}
		if got := unfiltered[p]; got == want {
			t.Errorf("without the filter, %s also gets %s; the probe cannot show the filter's refusal", p, got)
		}
	}
	for _, p := range ordinaryProbes {
		if got := filtered[p]; got != "ok" {
			t.Errorf("with the filter, %s: %s; want ok", p, got)
		}
		if got := unfiltered[p]; got != "ok" {
			t.Errorf("without the filter, %s: %s; want ok", p, got)
		}
	}
	t.Logf("without the filter: %v", unfiltered)
}

// A system call of x32, whose numbers are not the filter's, kills the process.
func TestTheChildsFilterKillsAnotherABIsSystemCall(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skipf("x32 is amd64's; this is %s", runtime.GOARCH)
	}
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), probeEnv+"=x32")
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) {
		t.Fatalf("the probe that made x32's getpid: %v (%s); want it killed by SIGSYS", err, out)
	}
	if ws := exit.Sys().(syscall.WaitStatus); !ws.Signaled() || ws.Signal() != syscall.SIGSYS {
		t.Fatalf("the probe that made x32's getpid ended with %v (%s); want it killed by SIGSYS", ws, out)
	}
}

// probe runs this test binary as a probe in mode and returns what each probe got.
func probe(t *testing.T, mode string) map[string]string {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), probeEnv+"="+mode, "TMPDIR="+t.TempDir())
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("the %s probe: %v\n%s", mode, err, stderr.String())
	}
	var got map[string]string
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("the %s probe's output %q: %v", mode, out, err)
	}
	return got
}

// runProbeMode runs in a process of its own: "filtered" installs the filter as confine does and
// then probes, "unfiltered" probes alone, "x32" installs the filter and makes x32's getpid, and
// "exit" exits (the program the exec probe starts). It prints what each probe got as JSON.
func runProbeMode(mode string) {
	switch mode {
	case "exit":
		os.Exit(0)
	case "filtered", "unfiltered", "x32":
	default:
		fmt.Fprintf(os.Stderr, "unknown probe mode %q\n", mode)
		os.Exit(2)
	}
	// Threads that exist before the filter, which it must reach too.
	release := make(chan struct{})
	if err := holdThreads(4, release); err != nil {
		fail(err)
	}
	before, err := taskStatus("Seccomp_filters")
	if err != nil {
		fail(err)
	}
	if mode != "unfiltered" {
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			fail(err)
		}
		if err := installFilter(); err != nil {
			fail(err)
		}
	}
	if mode == "x32" {
		// Not dumpable, so that the kill leaves no core file.
		_ = unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0)
		_, _, errno := unix.RawSyscall(x32SyscallBit|unix.SYS_GETPID, 0, 0, 0)
		fail(fmt.Errorf("x32's getpid returned (%v) instead of killing the process", errno))
	}
	// Every thread had the same filters, and has one more with this one.
	want := before[0]
	if mode == "filtered" {
		want = filtersAfter(want)
	}
	got := map[string]string{}
	for _, p := range []struct {
		name string
		call func() error
	}{
		{"read a file", func() error { _, err := os.ReadFile("/proc/self/status"); return err }},
		{"unix socket", unixSocketRoundTrip},
		{"new threads", func() error {
			// Threads made after the filter: in a cgo program, as this and the agent are, each
			// is glibc's pthread_create, which tries clone3 first and falls back to clone.
			// Each thread, old or new, has the filter and no_new_privs.
			more := make(chan struct{})
			defer close(more)
			if err := holdThreads(16, more); err != nil {
				return err
			}
			after, err := taskStatus("Pid")
			if err != nil {
				return err
			}
			// The runtime may lock an idle thread it had, but not 16 of the few it had.
			if len(after) < 16 || len(after) <= len(before) {
				return fmt.Errorf("%d threads before, %d after 16 goroutines each locked one", len(before), len(after))
			}
			return everyThreadHas(want, mode == "filtered")
		}},
		{"timer", func() error {
			select {
			case <-time.After(time.Millisecond):
				return nil
			case <-time.After(10 * time.Second):
				return errors.New("a 1 ms timer did not fire in 10 s")
			}
		}},
		{"exec", func() error {
			cmd := exec.Command(os.Args[0])
			cmd.Env = append(os.Environ(), probeEnv+"=exit")
			return cmd.Run()
		}},
		{"setns", func() error {
			fd, err := unix.Open("/proc/self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				return err
			}
			defer unix.Close(fd)
			// Into the namespace it is in already, on a thread of its own.
			runtime.LockOSThread()
			return unix.Setns(fd, unix.CLONE_NEWNET)
		}},
		{"mount", func() error { return unix.Mount("none", missingPath, "tmpfs", 0, "") }},
		{"umount2", func() error { return unix.Unmount(missingPath, 0) }},
		{"fsopen", func() error { return closing(unix.Fsopen("tmpfs", unix.FSOPEN_CLOEXEC)) }},
		{"open_tree", func() error { return closing(unix.OpenTree(unix.AT_FDCWD, missingPath, unix.OPEN_TREE_CLOEXEC)) }},
		{"chroot", func() error { return unix.Chroot(missingPath) }},
		{"bpf", func() error { return errnoOf(unix.Syscall(unix.SYS_BPF, 1<<20, 0, 0)) }},
		{"perf_event_open", func() error {
			return errnoOf(unix.Syscall6(unix.SYS_PERF_EVENT_OPEN, 0, 0, ^uintptr(0), ^uintptr(0), 0, 0))
		}},
		{"keyctl", func() error {
			_, err := unix.KeyctlGetKeyringID(unix.KEY_SPEC_PROCESS_KEYRING, false)
			return ignoreErrno(err, unix.ENOKEY)
		}},
		{"io_uring_setup", func() error { return errnoOf(unix.Syscall(unix.SYS_IO_URING_SETUP, 0, 0, 0)) }},
		{"userfaultfd", func() error { return errnoOf(unix.Syscall(unix.SYS_USERFAULTFD, ^uintptr(0), 0, 0)) }},
		{"ptrace", func() error { return errnoOf(unix.Syscall6(unix.SYS_PTRACE, unix.PTRACE_PEEKDATA, 0, 0, 0, 0, 0)) }},
		{"clone3", func() error { return errnoOf(unix.Syscall(unix.SYS_CLONE3, 0, 0, 0)) }},
		{"clone(CLONE_NEWNET)", func() error { return cloneAndReap(unix.CLONE_NEWNET) }},
		{"clone(CLONE_NEWUSER)", func() error { return cloneAndReap(unix.CLONE_NEWUSER) }},
		// A Go process has threads, so the kernel refuses it a new user namespace by unshare
		// (EINVAL) whatever the filter; the child's way to one is clone, above.
		{"unshare(CLONE_NEWUSER)", func() error { return unix.Unshare(unix.CLONE_NEWUSER) }},
		// Last: without the filter it moves this thread to a new network namespace.
		{"unshare(CLONE_NEWNET)", func() error { runtime.LockOSThread(); return unix.Unshare(unix.CLONE_NEWNET) }},
	} {
		got[p.name] = outcome(p.call())
	}
	close(release)
	if err := json.NewEncoder(os.Stdout).Encode(got); err != nil {
		fail(err)
	}
	os.Exit(0)
}

// missingPath does not exist: the calls on it that the filter lets through fail with ENOENT.
const missingPath = "/nonexistent-lifeboat-probe"

func fail(err error) {
	fmt.Fprintf(os.Stderr, "probe: %v\n", err)
	os.Exit(1)
}

// outcome is "ok", an errno's name, or the error's text.
func outcome(err error) string {
	if err == nil {
		return "ok"
	}
	var errno unix.Errno
	if errors.As(err, &errno) {
		if name := unix.ErrnoName(errno); name != "" {
			return name
		}
	}
	return err.Error()
}

func errnoOf(r1, _ uintptr, errno unix.Errno) error {
	if errno != 0 {
		return errno
	}
	if r1 != 0 {
		_ = unix.Close(int(r1))
	}
	return nil
}

func closing(fd int, err error) error {
	if err == nil {
		_ = unix.Close(fd)
	}
	return err
}

func ignoreErrno(err error, ok unix.Errno) error {
	if errors.Is(err, ok) {
		return nil
	}
	return err
}

// cloneAndReap forks with flags, as the child could reach a new namespace despite its threads; the
// new process exits at once, before any Go code runs in it.
func cloneAndReap(flags uintptr) error {
	pid, errno := rawClone(flags | uintptr(unix.SIGCHLD))
	if errno != 0 {
		return errno
	}
	var ws unix.WaitStatus
	if _, err := unix.Wait4(int(pid), &ws, 0, nil); err != nil {
		return err
	}
	return nil
}

//go:nosplit
//go:norace
func rawClone(flags uintptr) (uintptr, unix.Errno) {
	pid, _, errno := unix.RawSyscall6(unix.SYS_CLONE, flags, 0, 0, 0, 0, 0)
	if errno == 0 && pid == 0 {
		unix.RawSyscall(unix.SYS_EXIT_GROUP, 0, 0, 0)
	}
	return pid, errno
}

func unixSocketRoundTrip() error {
	path := filepath.Join(os.TempDir(), "probe.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		return err
	}
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		buf := make([]byte, 4)
		if _, err := c.Read(buf); err == nil {
			_, _ = c.Write(buf)
		}
	}()
	c, err := net.Dial("unix", path)
	if err != nil {
		return err
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		return err
	}
	if _, err := c.Write([]byte("ping")); err != nil {
		return err
	}
	buf := make([]byte, 4)
	if _, err := c.Read(buf); err != nil {
		return err
	}
	if string(buf) != "ping" {
		return fmt.Errorf("the echo is %q", buf)
	}
	return nil
}

// holdThreads makes n goroutines each hold a thread of its own until release closes, and returns
// once they all do.
func holdThreads(n int, release <-chan struct{}) error {
	held := make(chan int, n)
	for range n {
		go func() {
			runtime.LockOSThread()
			held <- unix.Gettid()
			<-release
		}()
	}
	seen := map[int]bool{}
	timeout := time.After(10 * time.Second)
	for range n {
		select {
		case tid := <-held:
			seen[tid] = true
		case <-timeout:
			return fmt.Errorf("%d of %d goroutines got a thread in 10 s", len(seen), n)
		}
	}
	if len(seen) != n {
		return fmt.Errorf("%d goroutines locked %d threads", n, len(seen))
	}
	return nil
}

// taskStatus is field of each of the process's threads' status.
func taskStatus(field string) ([]string, error) {
	var values []string
	err := eachTask(func(fields map[string]string) error {
		values = append(values, fields[field])
		return nil
	})
	return values, err
}

func filtersAfter(before string) string {
	var n int
	if _, err := fmt.Sscan(before, &n); err != nil {
		fail(fmt.Errorf("reading the thread's Seccomp_filters %q: %w", before, err))
	}
	return fmt.Sprint(n + 1)
}

// everyThreadHas checks that each thread has filters seccomp filters, and, if nnp, no_new_privs.
func everyThreadHas(filters string, nnp bool) error {
	return eachTask(func(fields map[string]string) error {
		if fields["Seccomp_filters"] != filters || (nnp && fields["NoNewPrivs"] != "1") {
			return fmt.Errorf("thread %s: Seccomp %s, Seccomp_filters %s, NoNewPrivs %s; want %s filters", fields["Pid"], fields["Seccomp"], fields["Seccomp_filters"], fields["NoNewPrivs"], filters)
		}
		return nil
	})
}

func eachTask(f func(fields map[string]string) error) error {
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return err
	}
	for _, task := range tasks {
		status, err := os.ReadFile(filepath.Join("/proc/self/task", task.Name(), "status"))
		if errors.Is(err, os.ErrNotExist) {
			continue // the thread ended
		}
		if err != nil {
			return err
		}
		fields := map[string]string{}
		for _, line := range strings.Split(string(status), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok {
				fields[k] = strings.TrimSpace(v)
			}
		}
		if err := f(fields); err != nil {
			return err
		}
	}
	return nil
}
