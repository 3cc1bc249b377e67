package node

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// execShimEnv carries the spec of a command exec'd in a container; its presence is what makes
// MaybeRunShim run the exec shim.
const execShimEnv = "LIFEBOAT_NODE_EXEC"

// The exec shim's descriptors: stdin, stdout and stderr (the command's), reportFD, then the
// container's mount and PID namespaces, its network namespace if execSpec.NetNS, and the
// binary if execSpec.Pinned.
const execNamespacesFD = reportFD + 1

// execSpec is a command to run in a running container, as its main process runs.
type execSpec struct {
	Args []string    `json:"args"`
	Env  []string    `json:"env"`
	Dir  string      `json:"dir"`
	User credentials `json:"user"`
	// TTY makes stdin the command's controlling terminal.
	TTY bool `json:"tty,omitempty"`
	// NetNS: the pod's network namespace is among the descriptors; otherwise the command stays
	// in the host's, as the container's does.
	NetNS bool `json:"netns,omitempty"`
	// Pinned: the binary is the last descriptor (one of the node's binaries); otherwise Args[0]
	// is a path, or a name looked up in the container's PATH.
	Pinned bool `json:"pinned,omitempty"`
}

// runExecShim joins the container's namespaces, starts the command there, reports on reportFD
// as the container shim does, and exits with the command's exit code (128+signal if a signal
// ended it). SIGHUP (the caller's terminal hung up) is passed on to the command; SIGTERM (the
// caller is gone) kills it.
//
// The command has no parent-death signal: Go's check that the parent still lives, made in the
// child, fails in another PID namespace (getppid is 0 there), and would kill it at once.
func runExecShim(encoded string) int {
	signals := make(chan os.Signal, 16)
	signal.Notify(signals, unix.SIGHUP, unix.SIGTERM)

	report := os.NewFile(reportFD, "report")
	pid, err := startExec(encoded)
	if err != nil {
		fmt.Fprint(report, err)
		return shimFailed
	}
	fmt.Fprint(report, shimStarted)
	report.Close()
	go func() {
		for sig := range signals {
			if sig == unix.SIGTERM {
				sig = unix.SIGKILL
			}
			_ = syscall.Kill(pid, sig.(syscall.Signal))
		}
	}()
	var ws syscall.WaitStatus
	for {
		_, err = syscall.Wait4(pid, &ws, 0, nil)
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	if err != nil {
		return shimFailed
	}
	if ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ws.ExitStatus()
}

func startExec(encoded string) (int, error) {
	var spec execSpec
	if err := json.Unmarshal([]byte(encoded), &spec); err != nil {
		return 0, fmt.Errorf("decoding the exec spec: %w", err)
	}
	mnt, pidNS, next := execNamespacesFD, execNamespacesFD+1, execNamespacesFD+2
	netNS, binary := -1, -1
	if spec.NetNS {
		netNS, next = next, next+1
	}
	if spec.Pinned {
		binary = next
	}
	// The command gets stdin, stdout and stderr only.
	for _, fd := range []int{reportFD, mnt, pidNS, netNS, binary} {
		if fd >= 0 {
			syscall.CloseOnExec(fd)
		}
	}
	// Never unlocked: the thread's namespaces are the container's from here on.
	runtime.LockOSThread()
	// A thread shares its root and working directory with the process's other threads unless
	// it unshares them, and may not join a mount namespace while it shares them.
	if err := unix.Unshare(unix.CLONE_FS); err != nil {
		return 0, fmt.Errorf("unsharing the thread's file system attributes: %w", err)
	}
	for _, ns := range []struct{ fd, kind int }{{mnt, unix.CLONE_NEWNS}, {pidNS, unix.CLONE_NEWPID}, {netNS, unix.CLONE_NEWNET}} {
		if ns.fd < 0 {
			continue
		}
		if err := unix.Setns(ns.fd, ns.kind); err != nil {
			return 0, fmt.Errorf("joining the container's namespaces: %w", err)
		}
	}
	if spec.User.NoNewPrivs {
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			return 0, fmt.Errorf("setting no_new_privs: %w", err)
		}
	}
	path := spec.Args[0]
	if binary >= 0 {
		// /proc is the container's, in whose PID namespace the command starts.
		path = fmt.Sprintf("/proc/self/fd/%d", binary)
	} else if !strings.Contains(path, "/") {
		// Looked up in the container's mount namespace, which this thread is in now.
		var err error
		if path, err = lookPath(path, spec.Env); err != nil {
			return 0, err
		}
	}
	attr := &syscall.SysProcAttr{
		Credential: &syscall.Credential{Uid: spec.User.UID, Gid: spec.User.GID, Groups: spec.User.Groups},
	}
	if spec.TTY {
		attr.Setsid, attr.Setctty, attr.Ctty = true, true, 0
	}
	pid, err := syscall.ForkExec(path, spec.Args, &syscall.ProcAttr{Dir: spec.Dir, Env: spec.Env, Files: []uintptr{0, 1, 2}, Sys: attr})
	if err != nil {
		return 0, fmt.Errorf("starting %s in the container: %w", spec.Args[0], err)
	}
	return pid, nil
}
