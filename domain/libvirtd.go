package domain

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/google/uuid"
)

// Config is where a private libvirtd keeps its state and listens.
type Config struct {
	// Dir holds everything the daemon writes: its configuration, the directories mounted
	// over libvirt's system paths, its log (libvirtd.log) and pid file. Created if missing.
	Dir string
	// SocketDir is where the daemon's socket libvirt-sock is made, such as the per-VMI
	// directory the agent watches. Empty means Dir.
	SocketDir string
	// Binary is the daemon to run; empty means /usr/sbin/libvirtd.
	Binary string
	// Mounts are bind mounts for this daemon alone, made in its own mount namespace before it
	// starts; only a root caller can have them. Two daemons on one machine can so see two
	// directories at the same path, as the same path on two nodes is two directories.
	Mounts []BindMount
	// User, for a root caller, runs the daemon as that user's session daemon, in its own mount
	// namespace: as a launcher runs it in its unprivileged pod, for the tests and benchmarks
	// that stand in for one. Dir and SocketDir are made the user's.
	User *User
	// QEMUCapabilities is a capabilities cache file that another daemon on this machine wrote
	// (Libvirtd.QEMUCapabilities), for this one to start without probing QEMU. Only a file
	// from a trusted prober may be given: libvirt believes what it says of QEMU. A file libvirt
	// finds stale costs only the probe it would have made anyway.
	QEMUCapabilities []byte
}

// User is the user and group a daemon runs as.
type User struct{ UID, GID int }

// Own gives dir and everything in it to u.
func (u User) Own(dir string) error {
	return filepath.WalkDir(dir, func(path string, _ os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(path, u.UID, u.GID)
	})
}

// stopTimeout is how long Stop waits after SIGTERM before it kills.
const stopTimeout = 10 * time.Second

// Libvirtd is a private libvirt daemon, a child of this process: a session daemon as this
// process's user, or for a root caller a system daemon in its own mount namespace.
type Libvirtd struct {
	layout daemonLayout
	cfg    Config
	binary string

	mu      sync.Mutex
	proc    *daemonProc
	stopped bool
	stop    sync.Once
	stopErr error
}

// daemonProc is one run of the daemon: the first, or one Restart started.
type daemonProc struct {
	cmd     *exec.Cmd
	done    chan struct{}
	waitErr error
}

// StartLibvirtd starts a private libvirtd for cfg and returns once it serves connections.
// ctx bounds only the start; the daemon runs until Stop.
func StartLibvirtd(ctx context.Context, cfg Config) (*Libvirtd, error) {
	layout, err := layoutFor(cfg)
	if err != nil {
		return nil, err
	}
	binary := cfg.Binary
	if binary == "" {
		binary = "/usr/sbin/libvirtd"
	}
	if err := writeDaemonFiles(layout); err != nil {
		return nil, err
	}
	if err := writeQEMUCaps(layout, cfg.QEMUCapabilities); err != nil {
		return nil, err
	}
	// On disk now, where a restarted daemon finds them too; not held for the daemon's life.
	cfg.QEMUCapabilities = nil
	if u := cfg.User; u != nil {
		for _, d := range []string{layout.dir, layout.socketDir} {
			if err := u.Own(d); err != nil {
				return nil, fmt.Errorf("giving the daemon's directory to its user: %w", err)
			}
		}
	}
	d := &Libvirtd{layout: layout, cfg: cfg, binary: binary}
	p, err := d.spawn(os.O_TRUNC)
	if err != nil {
		return nil, err
	}
	d.proc = p
	if err := d.waitReady(ctx, p); err != nil {
		_ = d.Stop()
		return nil, err
	}
	return d, nil
}

// spawn starts the daemon's process, its output going to its log opened with logFlag
// (O_TRUNC on the first start, O_APPEND on a restart, which keeps what the dead daemon wrote).
func (d *Libvirtd) spawn(logFlag int) (*daemonProc, error) {
	logFile, err := os.OpenFile(d.layout.daemonLog(), os.O_WRONLY|os.O_CREATE|logFlag, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening the libvirtd log: %w", err)
	}
	cmd, err := daemonCommand(d.layout, d.cfg, d.binary, logFile)
	if err != nil {
		logFile.Close()
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("starting libvirtd: %w", err)
	}
	p := &daemonProc{cmd: cmd, done: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		logFile.Close()
		close(p.done)
	}()
	return p, nil
}

// Restart starts the daemon again after it exited (killed, or crashed) and returns once the new
// one serves connections. It writes nothing anew: the new daemon has the old one's configuration
// and host UUID, and finds the status files of the domains the old one ran in its run directory.
// libvirt's QEMU driver reattaches to every QEMU of those still running (QEMU does not depend
// on its daemon, and runs on without it), so their guests go on as they were. ctx bounds the
// start; a daemon that does not come up is killed again, and Restart may be called again.
func (d *Libvirtd) Restart(ctx context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.stopped {
		return errors.New("restarting libvirtd: it was stopped")
	}
	select {
	case <-d.proc.done:
	default:
		return errors.New("restarting libvirtd: it still runs")
	}
	p, err := d.spawn(os.O_APPEND)
	if err != nil {
		return err
	}
	if err := d.waitReady(ctx, p); err != nil {
		// Its process group: a shim and its daemon. The guests' QEMUs are not in it.
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
		return err
	}
	d.proc = p
	return nil
}

// daemonCommand runs binary for l. A session daemon of the caller's own is started as it is;
// any other through the shim, which makes its mounts (a system daemon's libvirt paths, cfg's
// own) and takes on cfg's user first.
func daemonCommand(l daemonLayout, cfg Config, binary string, log *os.File) (*exec.Cmd, error) {
	args := []string{"-f", l.confFile(), "-p", l.pidFile()}
	// A daemon whose owner died (a test binary killed by its timeout, say) goes too.
	attr := &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	env := append(os.Environ(), l.env()...)
	if l.session && cfg.User == nil && len(cfg.Mounts) == 0 {
		cmd := exec.Command(binary, args...)
		cmd.Env = env
		cmd.Stdout, cmd.Stderr, cmd.SysProcAttr = log, log, attr
		return cmd, nil
	}
	var mounts []BindMount
	if !l.session {
		mounts = l.mounts()
	}
	spec, err := json.Marshal(shimSpec{Mounts: append(mounts, cfg.Mounts...), User: cfg.User, Binary: binary, Args: args})
	if err != nil {
		return nil, err
	}
	attr.Unshareflags = syscall.CLONE_NEWNS
	return &exec.Cmd{
		// /proc/self/exe is this very binary even if its file was replaced or removed since.
		Path:        "/proc/self/exe",
		Args:        []string{"lifeboat-libvirtd-shim"},
		Env:         append(env, shimEnv+"="+string(spec)),
		Stdout:      log,
		Stderr:      log,
		SysProcAttr: attr,
	}, nil
}

// layoutFor checks cfg and makes its paths absolute: they end up in config files and are
// used from inside the daemon's namespace.
func layoutFor(cfg Config) (daemonLayout, error) {
	if cfg.Dir == "" {
		return daemonLayout{}, errors.New("starting libvirtd: Config.Dir is empty")
	}
	if cfg.SocketDir == "" {
		cfg.SocketDir = cfg.Dir
	}
	if (cfg.User != nil || len(cfg.Mounts) > 0) && os.Geteuid() != 0 {
		return daemonLayout{}, errors.New("starting libvirtd: only a root caller can give the daemon a user or mounts")
	}
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return daemonLayout{}, err
	}
	socketDir, err := filepath.Abs(cfg.SocketDir)
	if err != nil {
		return daemonLayout{}, err
	}
	for _, p := range []string{dir, socketDir} {
		if strings.ContainsAny(p, "\"\n") {
			return daemonLayout{}, fmt.Errorf("starting libvirtd: path %q has a quote or newline, which libvirt's config files cannot hold", p)
		}
	}
	return daemonLayout{dir: dir, socketDir: socketDir, session: os.Geteuid() != 0 || cfg.User != nil, driverModule: qemuDriverModule()}, nil
}

func writeDaemonFiles(l daemonLayout) error {
	for _, d := range l.dirs() {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return fmt.Errorf("creating libvirtd's directories: %w", err)
		}
	}
	files := map[string]string{
		l.confFile(): libvirtdConf(l.socketDir, uuid.NewString()),
		l.qemuConf(): qemuConf(l.session),
	}
	for path, content := range files {
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			return fmt.Errorf("writing libvirtd's configuration: %w", err)
		}
	}
	if l.driverModule != "" {
		link := filepath.Join(l.driverDir(), filepath.Base(l.driverModule))
		if err := os.Remove(link); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("libvirtd's driver directory: %w", err)
		}
		if err := os.Symlink(l.driverModule, link); err != nil {
			return fmt.Errorf("libvirtd's driver directory: %w", err)
		}
	}
	return nil
}

// DaemonPid is the pid of the running libvirtd itself, from its pid file (Pid is its shim's
// where it has one).
func (d *Libvirtd) DaemonPid() (int, error) { return readPidFile(d.layout.pidFile()) }

// QEMUPid is the pid of the QEMU running the named domain, from the pid file libvirt keeps.
func (d *Libvirtd) QEMUPid(name string) (int, error) {
	return readPidFile(filepath.Join(d.layout.qemuPidDir(), name+".pid"))
}

func readPidFile(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, fmt.Errorf("reading a pid: %w", err)
	}
	var pid int
	if _, err := fmt.Sscan(string(b), &pid); err != nil {
		return 0, fmt.Errorf("reading the pid in %s: %w", path, err)
	}
	return pid, nil
}

// Socket is the path of the daemon's read-write socket, for Connect.
func (d *Libvirtd) Socket() string { return d.layout.socket() }

// LogPath is the daemon's log: its standard output and error, warnings and errors only.
func (d *Libvirtd) LogPath() string { return d.layout.daemonLog() }

// Done is closed when the daemon has exited; after a Restart, the new daemon's.
func (d *Libvirtd) Done() <-chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.proc.done
}

// Pid is the process this Libvirtd started for the current daemon: the daemon itself, or the
// shim that is its parent (see daemonCommand).
func (d *Libvirtd) Pid() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.proc.cmd.Process.Pid
}

// readyPoll is how often waitReady tries the daemon's socket. A daemon listens some 30 ms after
// it starts (more on a busy node); a migration target's start waits on this, so a coarser poll
// would add most of a period to every target launcher's start, and a dial costs microseconds.
const readyPoll = 5 * time.Millisecond

// waitReady polls until the daemon answers on its socket, it exits, or ctx ends. A QEMU
// connection is the test: it needs the daemon's QEMU driver to be up, not just the socket.
func (d *Libvirtd) waitReady(ctx context.Context, p *daemonProc) error {
	ticker := time.NewTicker(readyPoll)
	defer ticker.Stop()
	for {
		if c, err := net.Dial("unix", d.Socket()); err == nil {
			c.Close()
			return d.answers(ctx, p)
		}
		select {
		case <-p.done:
			return d.exitError(p, "libvirtd exited before it listened on "+d.Socket())
		case <-ctx.Done():
			return fmt.Errorf("waiting for libvirtd to listen on %s: %w; %s", d.Socket(), ctx.Err(), d.logTail())
		case <-ticker.C:
		}
	}
}

// answers opens and closes a libvirt connection. libvirtd accepts connections only once
// its drivers are up, so the call may wait; it runs aside so ctx and the daemon's exit still end the wait.
func (d *Libvirtd) answers(ctx context.Context, p *daemonProc) error {
	result := make(chan error, 1)
	go func() {
		c, err := Connect(d.Socket())
		if err == nil {
			err = c.Close()
		}
		result <- err
	}()
	select {
	case err := <-result:
		if err != nil {
			return fmt.Errorf("libvirtd listens on %s but does not serve: %w; %s", d.Socket(), err, d.logTail())
		}
		return nil
	case <-p.done:
		return d.exitError(p, "libvirtd exited while starting")
	case <-ctx.Done():
		return fmt.Errorf("waiting for libvirtd on %s to serve: %w; %s", d.Socket(), ctx.Err(), d.logTail())
	}
}

// Stop ends the daemon (SIGTERM, then SIGKILL after a timeout) and then kills the QEMU
// processes it leaves behind: libvirtd keeps guests running when it exits, by design,
// but a VM pod's daemon goes only when its VM goes.
func (d *Libvirtd) Stop() error {
	d.stop.Do(func() {
		// A Restart under way finishes first; none starts after this.
		d.mu.Lock()
		d.stopped = true
		p := d.proc
		d.mu.Unlock()
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-p.done:
			case <-time.After(stopTimeout):
				slog.Warn("libvirtd did not exit on SIGTERM; killing it", "pid", p.cmd.Process.Pid, "waited", stopTimeout)
				_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
				<-p.done
			}
		}
		d.stopErr = killQEMUs(d.layout.qemuPidDir())
	})
	return d.stopErr
}

func (d *Libvirtd) exitError(p *daemonProc, what string) error {
	return fmt.Errorf("%s (%v); %s", what, p.waitErr, d.logTail())
}

// logTail is the end of the daemon's log, for error messages.
func (d *Libvirtd) logTail() string {
	b, err := os.ReadFile(d.LogPath())
	if err != nil || len(bytes.TrimSpace(b)) == 0 {
		return "its log " + d.LogPath() + " is empty"
	}
	const max = 2000
	if len(b) > max {
		b = b[len(b)-max:]
	}
	return "the end of its log " + d.LogPath() + ":\n" + string(bytes.TrimSpace(b))
}
