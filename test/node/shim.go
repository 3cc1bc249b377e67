package node

import (
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/lifeboat-vm/lifeboat/domain/reap"
)

const (
	// shimEnv carries the shim's spec; its presence is what makes MaybeRunShim act.
	shimEnv = "LIFEBOAT_NODE_SHIM"
	// reportFD is the pipe on which the shim tells the node whether the command started:
	// shimStarted, or what went wrong.
	reportFD    = 3
	shimStarted = "started"
	// shimFailed is the exit code of a shim that could not start its command, the code
	// container runtimes give a container that fails to start.
	shimFailed = 128
)

// forwardedSignals are passed on to the container's command.
var forwardedSignals = []os.Signal{unix.SIGTERM, unix.SIGINT, unix.SIGHUP, unix.SIGQUIT, unix.SIGUSR1, unix.SIGUSR2}

// shimSpec is one container's main process and its mounts.
type shimSpec struct {
	Path   string      `json:"path"`
	Args   []string    `json:"args"`
	Env    []string    `json:"env"`
	Dir    string      `json:"dir"`
	Mounts []bindMount `json:"mounts,omitempty"`
	// User is who the command runs as; the shim itself stays root to make the mounts.
	User credentials `json:"user"`
	// Devices are made in the container, its user's.
	Devices []shimDevice `json:"devices,omitempty"`
	// DeviceDir is where the devices are made before they are bound at their paths.
	DeviceDir string `json:"deviceDir,omitempty"`
	// NetNS is the pod's network namespace, which the command joins; empty means the host's.
	NetNS string `json:"netns,omitempty"`
	// CPUGroup is the cpu cgroup the shim joins before it starts the command (Config.PodCPUShares).
	CPUGroup string `json:"cpuGroup,omitempty"`
}

// MaybeRunShim turns the process into a container's init, or the starter of a command exec'd in
// a container, when the node started it as one, and then never returns; otherwise it returns at
// once. Every program that starts nodes must call
// it first thing in main or TestMain, because each container runs under a re-execution of the
// current binary:
//
//	func TestMain(m *testing.M) {
//		node.MaybeRunShim()
//		controlplane.Main(m, &cluster, controlplane.Options{})
//	}
func MaybeRunShim() {
	if encoded, ok := os.LookupEnv(shimEnv); ok {
		os.Exit(runShim(encoded))
	}
	// A command exec'd in a container (kubectl exec) is started by a shim of its own.
	if encoded, ok := os.LookupEnv(execShimEnv); ok {
		os.Exit(runExecShim(encoded))
	}
}

// runShim is PID 1 of a container's PID and mount namespaces. It makes the container's mounts,
// starts the command, forwards signals to it, reaps every orphan, and exits with the command's
// exit code (128+signal if a signal ended it). When it exits, the kernel kills whatever is left
// in the namespace, daemons included.
func runShim(encoded string) int {
	// Handlers first: until this PID 1 has one, the kernel drops the node's SIGTERM.
	signals := make(chan os.Signal, 16)
	signal.Notify(signals, forwardedSignals...)

	report := os.NewFile(reportFD, "report")
	// The command must not hold the report pipe, or the node would wait for it to exit.
	syscall.CloseOnExec(reportFD)
	pid, err := startContained(encoded)
	if err != nil {
		fmt.Fprintf(os.Stderr, "lifeboat node shim: %v\n", err)
		fmt.Fprint(report, err)
		return shimFailed
	}
	fmt.Fprint(report, shimStarted)
	report.Close()

	go func() {
		for sig := range signals {
			_ = syscall.Kill(pid, sig.(syscall.Signal))
		}
	}()
	// Orphans are re-parented to this PID 1: all are reaped.
	code, err := reap.Until(pid)
	if err != nil {
		fmt.Fprintf(os.Stderr, "lifeboat node shim: %v\n", err)
		return shimFailed
	}
	return code
}

func startContained(encoded string) (int, error) {
	var spec shimSpec
	if err := json.Unmarshal([]byte(encoded), &spec); err != nil {
		return 0, fmt.Errorf("decoding the container spec: %w", err)
	}
	if spec.CPUGroup != "" {
		// 0 is the writer: the shim moves itself, and what it starts is born there.
		if err := os.WriteFile(filepath.Join(spec.CPUGroup, "cgroup.procs"), []byte("0"), 0); err != nil {
			return 0, fmt.Errorf("joining the pods' cpu cgroup: %w", err)
		}
	}
	// The new mount namespace starts as a copy of the machine's: make it private so that
	// nothing mounted here propagates back.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return 0, fmt.Errorf("making / private: %w", err)
	}
	// A /proc of the new PID namespace, where the container's processes find their own PIDs.
	if err := unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return 0, fmt.Errorf("mounting /proc: %w", err)
	}
	for _, m := range spec.Mounts {
		if err := bind(m); err != nil {
			return 0, fmt.Errorf("mounting %s at %s: %w", m.Source, m.Target, err)
		}
	}
	if err := makeDevices(spec.Devices, spec.DeviceDir, spec.User); err != nil {
		return 0, err
	}
	devNull, err := os.Open(os.DevNull)
	if err != nil {
		return 0, err
	}
	defer devNull.Close()
	// no_new_privs is a thread's, inherited by what it forks: set on the thread that forks.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	// The network namespace is a thread's too: joined by the thread that forks.
	if spec.NetNS != "" {
		ns, err := os.Open(spec.NetNS)
		if err != nil {
			return 0, fmt.Errorf("opening the pod's network namespace: %w", err)
		}
		err = unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET)
		ns.Close()
		if err != nil {
			return 0, fmt.Errorf("joining the pod's network namespace: %w", err)
		}
	}
	if spec.User.NoNewPrivs {
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			return 0, fmt.Errorf("setting no_new_privs: %w", err)
		}
	}
	// The binary is the node's, at a path of this machine that the container's user may not be
	// able to reach (a checkout under /root): opened here, as root, and executed through the
	// descriptor, as a runtime runs its image's binary whatever the node's directories allow.
	binary, err := os.OpenFile(spec.Path, unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("opening %s: %w", spec.Path, err)
	}
	defer binary.Close()
	// Leaving root for another user clears every capability, as in a runtime's container.
	pid, err := syscall.ForkExec(fmt.Sprintf("/proc/self/fd/%d", binary.Fd()), spec.Args, &syscall.ProcAttr{
		Dir:   spec.Dir,
		Env:   spec.Env,
		Files: []uintptr{devNull.Fd(), 1, 2},
		Sys: &syscall.SysProcAttr{Credential: &syscall.Credential{
			Uid: spec.User.UID, Gid: spec.User.GID, Groups: spec.User.Groups,
		}},
	})
	if err != nil {
		return 0, fmt.Errorf("starting %s: %w", spec.Path, err)
	}
	return pid, nil
}

// bind mounts m.Source at m.Target, creating the mount point as a runtime does in a
// container's root file system; here that is the machine's.
func bind(m bindMount) error {
	info, err := os.Stat(m.Source)
	if err != nil {
		return err
	}
	if info.IsDir() {
		err = os.MkdirAll(m.Target, 0o755)
	} else if err = os.MkdirAll(filepath.Dir(m.Target), 0o755); err == nil {
		var f *os.File
		if f, err = os.OpenFile(m.Target, os.O_CREATE|os.O_RDONLY, 0o644); err == nil {
			err = f.Close()
		}
	}
	if err != nil {
		return fmt.Errorf("creating the mount point: %w", err)
	}
	if err := unix.Mount(m.Source, m.Target, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return err
	}
	if m.ReadOnly {
		return unix.Mount("", m.Target, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, "")
	}
	return nil
}
