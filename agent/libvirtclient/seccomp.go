package libvirtclient

import (
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// The child's own seccomp filter, on top of the container's. The agent's container holds
// CAP_SYS_ADMIN, so its RuntimeDefault profile is the runtime's permissive variant (containerd
// builds the profile from the container's capabilities): it allows namespaces and mounts. The child
// keeps that profile without the capability, and after its move of a new root over "/" the kernel
// does not count it as chrooted, so it could still create a user namespace, be root in it, and
// reach what only a namespace's root reaches (nf_tables and the like), which a launcher cannot.
// libvirt's client over a unix socket needs none of what this refuses.

// refusedSyscalls are refused with EPERM. The numbers are the build's architecture's (x/sys's
// tables are per GOARCH); auditArch names that architecture to the kernel.
var refusedSyscalls = []uintptr{
	// Namespaces: a new user namespace makes its creator root in it, and that root may create the
	// other namespaces and reach their kernel interfaces. clone's namespace flags are below.
	unix.SYS_UNSHARE, unix.SYS_SETNS,
	// Mounts, old and new API, and changing root: the child's root is final once it is entered.
	unix.SYS_MOUNT, unix.SYS_UMOUNT2, unix.SYS_PIVOT_ROOT, unix.SYS_CHROOT,
	unix.SYS_FSOPEN, unix.SYS_FSCONFIG, unix.SYS_FSMOUNT, unix.SYS_FSPICK, unix.SYS_MOVE_MOUNT,
	unix.SYS_OPEN_TREE, unix.SYS_OPEN_TREE_ATTR, unix.SYS_MOUNT_SETATTR,
	// Kernel interfaces open to unprivileged processes that a libvirt client has no use for, and
	// where kernel bugs are often found.
	unix.SYS_BPF, unix.SYS_PERF_EVENT_OPEN, unix.SYS_USERFAULTFD,
	unix.SYS_KEYCTL, unix.SYS_ADD_KEY, unix.SYS_REQUEST_KEY,
	unix.SYS_IO_URING_SETUP, unix.SYS_IO_URING_ENTER, unix.SYS_IO_URING_REGISTER,
	// Other processes' memory.
	unix.SYS_PTRACE, unix.SYS_PROCESS_VM_READV, unix.SYS_PROCESS_VM_WRITEV,
	// The kernel itself (these need capabilities the child has not; refused all the same).
	unix.SYS_KEXEC_LOAD, unix.SYS_KEXEC_FILE_LOAD, unix.SYS_INIT_MODULE, unix.SYS_FINIT_MODULE, unix.SYS_DELETE_MODULE,
}

// cloneNewFlags are clone's namespace flags; clone with any of them is refused with EPERM. The
// kernel reads only the lower 32 bits of clone's flags, which hold them all. (CLONE_NEWTIME shares
// its bit with the exit signal in clone, and is clone3's and unshare's only.)
const cloneNewFlags = unix.CLONE_NEWNS | unix.CLONE_NEWCGROUP | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC |
	unix.CLONE_NEWUSER | unix.CLONE_NEWPID | unix.CLONE_NEWNET

// auditArch is the architecture each build's filter is for, by GOARCH: both little-endian, with
// clone's flags its first argument. On another architecture the child refuses to run.
var auditArch = map[string]uint32{
	"amd64": unix.AUDIT_ARCH_X86_64,
	"arm64": unix.AUDIT_ARCH_AARCH64,
}

// x32SyscallBit marks the x32 ABI's system calls on amd64, which share AUDIT_ARCH_X86_64.
const x32SyscallBit = 0x40000000

// Offsets in struct seccomp_data: nr, arch, instruction_pointer, args[6]; the lower half of a
// 64-bit argument comes first on a little-endian machine.
const (
	offNr      = 0
	offArch    = 4
	offArg0Low = 16
)

const (
	retEPERM  = unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)
	retENOSYS = unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)
	retKill   = unix.SECCOMP_RET_KILL_PROCESS
	retAllow  = unix.SECCOMP_RET_ALLOW
)

// childFilter is the child's filter for goarch:
//   - another architecture's or ABI's system call (i386's int 0x80 on amd64, x32) kills the
//     process, as no code of the child makes one and the numbers below would not hold for it;
//   - refusedSyscalls and clone with a namespace flag fail with EPERM;
//   - clone3 fails with ENOSYS, as on a kernel without it: its flags are in memory, which a filter
//     cannot read, and glibc's pthread_create and Go fall back to clone, whose flags it can;
//   - everything else is left to the container's profile.
func childFilter(goarch string) ([]bpf.Instruction, error) {
	arch, ok := auditArch[goarch]
	if !ok {
		return nil, fmt.Errorf("no seccomp filter for the architecture %s", goarch)
	}
	prog := []bpf.Instruction{
		bpf.LoadAbsolute{Off: offArch, Size: 4},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: arch, SkipTrue: 1},
		bpf.RetConstant{Val: retKill},
		bpf.LoadAbsolute{Off: offNr, Size: 4},
	}
	if goarch == "amd64" {
		prog = append(prog,
			bpf.JumpIf{Cond: bpf.JumpBitsNotSet, Val: x32SyscallBit, SkipTrue: 1},
			bpf.RetConstant{Val: retKill})
	}
	// Each test is followed by its refusal, which it skips if the call is another.
	for _, nr := range refusedSyscalls {
		prog = append(prog,
			bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: uint32(nr), SkipTrue: 1},
			bpf.RetConstant{Val: retEPERM})
	}
	prog = append(prog,
		bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: unix.SYS_CLONE3, SkipTrue: 1},
		bpf.RetConstant{Val: retENOSYS},
		bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: unix.SYS_CLONE, SkipTrue: 3},
		bpf.LoadAbsolute{Off: offArg0Low, Size: 4},
		bpf.JumpIf{Cond: bpf.JumpBitsNotSet, Val: cloneNewFlags, SkipTrue: 1},
		bpf.RetConstant{Val: retEPERM},
		bpf.RetConstant{Val: retAllow},
	)
	return prog, nil
}

// installFilter installs childFilter on every thread of the process (SECCOMP_FILTER_FLAG_TSYNC:
// the Go runtime, and libvirt's client, run several), which also sets no_new_privs on each. The
// calling thread must have no_new_privs set.
func installFilter() error {
	prog, err := childFilter(runtime.GOARCH)
	if err != nil {
		return err
	}
	raw, err := bpf.Assemble(prog)
	if err != nil {
		return fmt.Errorf("assembling the seccomp filter: %w", err)
	}
	filter := make([]unix.SockFilter, len(raw))
	for i, ins := range raw {
		filter[i] = unix.SockFilter{Code: ins.Op, Jt: ins.Jt, Jf: ins.Jf, K: ins.K}
	}
	fprog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
	r, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(&fprog)))
	runtime.KeepAlive(filter)
	if errno != 0 {
		return fmt.Errorf("installing the seccomp filter: %w", errno)
	}
	// With TSYNC, a thread that cannot take the filter fails the call with its ID.
	if r != 0 {
		return fmt.Errorf("installing the seccomp filter: thread %d cannot take it", r)
	}
	return nil
}
