package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"runtime"
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
				_ = unix.IoctlSetWinsize(int(stdio.terminalFD.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: size.Height, Col: size.Width})
			}
		}()
	}
	exited := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			_ = p.Signal(syscall.SIGKILL)
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

// start starts cmd in the container's namespaces. They are joined by a thread of the node's
// that forks the command and then ends with its goroutine, never to run anything else: a
// thread with a mount namespace of its own first unshares its file system attributes, which
// the other threads of the process share.
func (e containerExecutor) start(cmd []string, files []*os.File, tty bool) (*os.Process, error) {
	spec := e.proc.spec
	binary, byDescriptor := e.binaries[cmd[0]]
	var pinned *os.File
	if byDescriptor {
		// As for the container's command: opened as root here, executed through the descriptor.
		var err error
		if pinned, err = os.OpenFile(binary, unix.O_PATH|unix.O_CLOEXEC, 0); err != nil {
			return nil, fmt.Errorf("opening %s: %w", binary, err)
		}
		defer pinned.Close()
	}
	pid := e.proc.pid()
	var namespaces []*os.File
	defer func() {
		for _, ns := range namespaces {
			ns.Close()
		}
	}()
	for _, path := range []string{fmt.Sprintf("/proc/%d/ns/mnt", pid), fmt.Sprintf("/proc/%d/ns/pid", pid), spec.NetNS} {
		if path == "" {
			continue
		}
		ns, err := os.Open(path)
		if err != nil {
			return nil, fmt.Errorf("opening the container's namespace %s: %w", path, err)
		}
		namespaces = append(namespaces, ns)
	}
	// The namespaces opened are the container's only if its shim had not exited, and so not been
	// reaped and its PID reused, before they were.
	select {
	case <-e.proc.done:
		return nil, errors.New("the container is not running")
	default:
	}

	type started struct {
		p   *os.Process
		err error
	}
	result := make(chan started, 1)
	go func() {
		// Never unlocked: the thread ends with this goroutine.
		runtime.LockOSThread()
		p, err := func() (*os.Process, error) {
			if err := unix.Unshare(unix.CLONE_FS); err != nil {
				return nil, fmt.Errorf("unsharing the thread's file system attributes: %w", err)
			}
			kinds := []int{unix.CLONE_NEWNS, unix.CLONE_NEWPID, unix.CLONE_NEWNET}
			for i, ns := range namespaces {
				if err := unix.Setns(int(ns.Fd()), kinds[i]); err != nil {
					return nil, fmt.Errorf("joining the container's namespace %s: %w", ns.Name(), err)
				}
			}
			if spec.User.NoNewPrivs {
				if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
					return nil, fmt.Errorf("setting no_new_privs: %w", err)
				}
			}
			path := cmd[0]
			if pinned != nil {
				// /proc is the container's, in whose PID namespace the command starts.
				path = fmt.Sprintf("/proc/self/fd/%d", pinned.Fd())
			} else if !strings.Contains(path, "/") {
				// Looked up in the container's mount namespace, which this thread is in now.
				var err error
				if path, err = lookPath(path, spec.Env); err != nil {
					return nil, err
				}
			}
			attr := &syscall.SysProcAttr{Credential: &syscall.Credential{
				Uid: spec.User.UID, Gid: spec.User.GID, Groups: spec.User.Groups,
			}}
			if tty {
				attr.Setsid, attr.Setctty, attr.Ctty = true, true, 0
			}
			p, err := os.StartProcess(path, cmd, &os.ProcAttr{Dir: spec.Dir, Env: spec.Env, Files: files, Sys: attr})
			if err != nil {
				return nil, fmt.Errorf("starting %s in the container: %w", cmd[0], err)
			}
			return p, nil
		}()
		result <- started{p, err}
	}()
	res := <-result
	return res.p, res.err
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
	if err := unix.IoctlSetPointerInt(int(ptmx.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		return fmt.Errorf("unlocking the terminal: %w", err)
	}
	// The terminal's other side, opened through the controlling one: no path to resolve.
	fd, _, errno := unix.Syscall(unix.SYS_IOCTL, ptmx.Fd(), unix.TIOCGPTPEER, uintptr(unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC))
	if errno != 0 {
		return fmt.Errorf("opening the terminal's other side: %w", errno)
	}
	pts := os.NewFile(fd, "pts")
	c.child = []*os.File{pts, pts, pts}
	if out == nil {
		out = io.Discard
	}
	// Ends with EIO once the command, and whatever it left holding the terminal, is gone.
	c.copying.Go(func() { _, _ = io.Copy(out, ptmx) })
	return nil
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
