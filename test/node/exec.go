package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/cri-streaming/pkg/streaming/remotecommand"
	"k8s.io/klog/v2"
	utilexec "k8s.io/utils/exec"

	"golang.org/x/sys/unix"
)

const (
	// streamIdleTimeout and streamCreationTimeout are the kubelet's defaults
	// (streamingConnectionIdleTimeout, and the CRI streaming server's).
	streamIdleTimeout     = 4 * time.Hour
	streamCreationTimeout = remotecommand.DefaultStreamCreationTimeout
	// outputGrace is how long an exec'd command's output is copied on after it has exited.
	outputGrace = 10 * time.Second
)

// running is the process of the container of pod named name, and its run (restart count), or
// nil if it does not run.
func (r *podRuntime) running(pod *corev1.Pod, name string) (*process, int32) {
	r.mu.Lock()
	rec := r.records[podKey(pod)]
	r.mu.Unlock()
	if rec == nil || rec.uid != pod.UID {
		return nil, 0
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	cr := rec.containers[name]
	if cr == nil || cr.proc == nil {
		return nil, 0
	}
	return cr.proc, cr.status.RestartCount
}

// exec serves /exec/{namespace}/{pod}[/{uid}]/{container}?command=…: it runs the command in the
// running container with the kubelet's streaming server (SPDY or WebSocket streams, the exit
// code in the status), as the kubelet hands an exec to its runtime's.
func (a *kubeletAPI) exec(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodPost {
		http.Error(w, "exec takes GET or POST", http.StatusMethodNotAllowed)
		return
	}
	streamOpts, err := remotecommand.NewOptions(r)
	if err != nil {
		writeError(w, badRequest("%v", err))
		return
	}
	command := r.URL.Query()["command"]
	if len(command) == 0 {
		writeError(w, badRequest("no command to run: give it as command= parameters"))
		return
	}
	pod, c, err := a.podContainer(r)
	if err != nil {
		writeError(w, err)
		return
	}
	proc, _ := a.runtime.running(pod, c.Name)
	if proc == nil {
		writeError(w, badRequest("container %q in pod %q is not running", c.Name, pod.Name))
		return
	}
	a.logger.V(2).Info("Exec in container", "pod", klog.KObj(pod), "container", c.Name, "command", command)
	executor := containerExecutor{proc: proc, binaries: a.runtime.binaries}
	remotecommand.ServeExec(w, r, executor, podString(pod), string(pod.UID), c.Name, command, streamOpts,
		streamIdleTimeout, streamCreationTimeout, remotecommand.SupportedStreamingProtocols)
}

// containerExecutor runs commands in one running container.
type containerExecutor struct {
	proc     *process
	binaries map[string]string
}

var _ remotecommand.Executor = containerExecutor{}

// ExecInContainer runs cmd as the container's command runs: in its mount, PID and network
// namespaces, as its user with its groups and no_new_privs, with its environment and working
// directory. cmd[0] is one of the node's binaries (Config.Binaries) as for a container's
// command, or else a path or a name looked up in the container's PATH. With tty, the command
// gets a terminal of its own as its controlling one, sized as resize says. It returns once the
// command has exited and its output is written: a utilexec.ExitError for a non-zero exit code.
func (e containerExecutor) ExecInContainer(ctx context.Context, _, _, _ string, cmd []string, in io.Reader, out, errOut io.WriteCloser, tty bool, resize <-chan remotecommand.TerminalSize, _ time.Duration) error {
	if len(cmd) == 0 {
		return errors.New("no command")
	}
	var stdio commandIO
	var err error
	if tty {
		err = stdio.terminal(out)
	} else {
		err = stdio.pipes(in, out, errOut)
	}
	if err != nil {
		return err
	}
	defer stdio.close()

	p, err := e.start(cmd, stdio.child, tty)
	stdio.closeChild()
	if err != nil {
		return err
	}
	if tty && in != nil {
		// Typed input goes to the terminal; when the stream ends (the caller has left), the
		// terminal hangs up, as a closed terminal session's does.
		go func() {
			_, _ = io.Copy(stdio.terminalFD, in)
			_ = p.Signal(syscall.SIGHUP)
		}()
	}
	if tty && resize != nil {
		go func() {
			for size := range resize {
				_ = stdio.terminalControl(func(fd int) error {
					return unix.IoctlSetWinsize(fd, unix.TIOCSWINSZ, &unix.Winsize{Row: size.Height, Col: size.Width})
				})
			}
		}()
	}
	exited := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			// The exec shim kills the command.
			_ = p.Signal(syscall.SIGTERM)
		case <-exited:
		}
	}()
	state, err := p.Wait()
	close(exited)
	if err != nil {
		return err
	}
	stdio.wait(outputGrace)
	if code := exitCode(state); code != 0 {
		return utilexec.CodeExitError{Err: fmt.Errorf("command terminated with exit code %d", code), Code: int(code)}
	}
	return nil
}

// start starts cmd in the container's namespaces, through an exec shim (a re-execution of the
// node's binary, see runExecShim) that joins them and starts the command as its child. The node
// joins no namespace itself: a thread of its own that did would have to end, and a process
// started from that thread with a parent-death signal (a container's shim) would die with it.
func (e containerExecutor) start(cmd []string, stdio []*os.File, tty bool) (*os.Process, error) {
	spec := execSpec{Args: cmd, Env: e.proc.spec.Env, Dir: e.proc.spec.Dir, User: e.proc.spec.User, TTY: tty}
	pid := e.proc.pid()
	paths := []string{fmt.Sprintf("/proc/%d/ns/mnt", pid), fmt.Sprintf("/proc/%d/ns/pid", pid)}
	if e.proc.spec.NetNS != "" {
		paths, spec.NetNS = append(paths, e.proc.spec.NetNS), true
	}
	var extra []*os.File
	defer func() {
		for _, f := range extra {
			f.Close()
		}
	}()
	for _, path := range paths {
		ns, err := os.Open(path)
		if err != nil {
			return nil, fmt.Errorf("opening the container's namespace %s: %w", path, err)
		}
		extra = append(extra, ns)
	}
	if binary, ok := e.binaries[cmd[0]]; ok {
		// As for the container's command: opened as root here, executed through the descriptor.
		pinned, err := os.OpenFile(binary, unix.O_PATH|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("opening %s: %w", binary, err)
		}
		extra, spec.Pinned = append(extra, pinned), true
	}
	// The namespaces opened are the container's only if its shim had not exited, and so not been
	// reaped and its PID reused, before they were.
	select {
	case <-e.proc.done:
		return nil, errors.New("the container is not running")
	default:
	}
	encoded, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	reportR, reportW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer reportR.Close()
	files := append(append(slices.Clone(stdio), reportW), extra...)
	p, err := os.StartProcess("/proc/self/exe", []string{"/proc/self/exe"}, &os.ProcAttr{
		Env: []string{execShimEnv + "=" + string(encoded)}, Files: files,
		// The shim dies with the node (and the command with its container).
		Sys: &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL},
	})
	reportW.Close()
	if err != nil {
		return nil, fmt.Errorf("starting the exec shim: %w", err)
	}
	// The shim closes the pipe once it has reported, and so does its exit.
	report, err := io.ReadAll(reportR)
	if err == nil && string(report) == shimStarted {
		return p, nil
	}
	state, _ := p.Wait()
	if len(report) == 0 {
		return nil, fmt.Errorf("the exec shim exited with code %d before starting %s", exitCode(state), cmd[0])
	}
	return nil, errors.New(string(report))
}

// lookPath finds name in the PATH of env (which the node always sets), or in the default one.
func lookPath(name string, env []string) (string, error) {
	path := defaultPath
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	for dir := range strings.SplitSeq(path, ":") {
		candidate := dir + "/" + name
		if info, err := os.Stat(candidate); err == nil && info.Mode().IsRegular() && info.Mode().Perm()&0o111 != 0 {
			return candidate, nil
		}
	}
	return "", fmt.Errorf("exec: %q: %w", name, exec.ErrNotFound)
}

// commandIO is the standard streams of an exec'd command: pipes, or a terminal.
type commandIO struct {
	// child are the command's stdin, stdout and stderr, closed here once it has them.
	child []*os.File
	// terminalFD is the terminal's controlling side, with tty.
	terminalFD *os.File
	// parent are the ends kept here; copying is what copies between them and the streams.
	parent  []*os.File
	copying sync.WaitGroup
}

// pipes connects the command's stdin, stdout and stderr to in, out and errOut by pipes, or to
// /dev/null where the stream is nil.
func (c *commandIO) pipes(in io.Reader, out, errOut io.Writer) error {
	null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	c.child = append(c.child, null)
	if in != nil {
		r, w, err := os.Pipe()
		if err != nil {
			return err
		}
		c.child[0] = r
		c.parent = append(c.parent, w, null)
		// Not waited for: the stream may never end, and the command not read it all.
		go func() {
			_, _ = io.Copy(w, in)
			w.Close()
		}()
	}
	for _, o := range []io.Writer{out, errOut} {
		if o == nil {
			c.child = append(c.child, null)
			continue
		}
		r, w, err := os.Pipe()
		if err != nil {
			return err
		}
		c.child = append(c.child, w)
		c.parent = append(c.parent, r)
		c.copying.Go(func() { _, _ = io.Copy(o, r) })
	}
	return nil
}

// terminal gives the command a new terminal as stdin, stdout and stderr, its output to out. What
// is typed into it is written to terminalFD.
func (c *commandIO) terminal(out io.Writer) error {
	ptmx, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		return fmt.Errorf("opening a terminal: %w", err)
	}
	c.terminalFD = ptmx
	c.parent = append(c.parent, ptmx)
	if err := c.terminalControl(func(fd int) error { return unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0) }); err != nil {
		return fmt.Errorf("unlocking the terminal: %w", err)
	}
	// The terminal's other side, opened through the controlling one: no path to resolve.
	var pts *os.File
	err = c.terminalControl(func(fd int) error {
		peer, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.TIOCGPTPEER, uintptr(unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC))
		if errno != 0 {
			return errno
		}
		pts = os.NewFile(peer, "pts")
		return nil
	})
	if err != nil {
		return fmt.Errorf("opening the terminal's other side: %w", err)
	}
	c.child = []*os.File{pts, pts, pts}
	if out == nil {
		out = io.Discard
	}
	// Ends with EIO once the command, and whatever it left holding the terminal, is gone.
	c.copying.Go(func() { _, _ = io.Copy(out, ptmx) })
	return nil
}

// terminalControl calls f with the terminal's controlling side, unless it is closed. (Its Fd
// would make it blocking, so that closing it would not end a read.)
func (c *commandIO) terminalControl(f func(fd int) error) error {
	raw, err := c.terminalFD.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := raw.Control(func(fd uintptr) { ferr = f(int(fd)) }); err != nil {
		return err
	}
	return ferr
}

// closeChild closes the command's ends once it has them (or has failed to start).
func (c *commandIO) closeChild() {
	closed := map[*os.File]bool{}
	for _, f := range c.child {
		if !closed[f] {
			f.Close()
			closed[f] = true
		}
	}
}

// wait waits until the command's output is copied, but no longer than grace: a process the
// command left running in the background may hold its output open.
func (c *commandIO) wait(grace time.Duration) {
	copied := make(chan struct{})
	go func() {
		c.copying.Wait()
		close(copied)
	}()
	select {
	case <-copied:
	case <-time.After(grace):
	}
}

// close closes what is left, which ends the copying of stdin.
func (c *commandIO) close() {
	for _, f := range c.parent {
		f.Close()
	}
}
