package libvirtclient

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/lifeboat-vm/lifeboat/domain"
)

// childCommand is the hidden subcommand that makes the agent's binary a libvirt client child.
const childCommand = "libvirt-client"

// ChildUID and ChildGID are who the child runs as once confined: nobody. Not root, and not the
// launchers' user (107), which owns every launcher's files; each child is alone in its own PID
// namespace and not dumpable, so no child can signal or trace another.
const (
	ChildUID = 65534
	ChildGID = 65534
)

// relayMount is where the relay's directory is in the child's root.
const relayMount = "/relay"

func isChild() bool { return len(os.Args) == 4 && os.Args[1] == childCommand }

// The child's parent-death signal, no-new-privileges flag and capabilities are per thread: the
// confinement runs on the main thread, the one the agent started, which reports them in
// /proc/<pid>/status.
func init() {
	if isChild() {
		runtime.LockOSThread()
	}
}

// MaybeRunChild turns this process into a libvirt client child if the agent started it as one
// (Start), and returns at once otherwise. Call it first thing in main (or TestMain) of any
// program that starts children, the agent's and the tests of the agent's packages.
func MaybeRunChild() {
	if !isChild() {
		return
	}
	if err := runChild(os.Args[2], os.Args[3]); err != nil {
		fmt.Fprintf(os.Stderr, "libvirt client: %v\n", err)
		os.Exit(1)
	}
	os.Exit(0)
}

func runChild(dir, socket string) error {
	if err := confine(dir); err != nil {
		return fmt.Errorf("confining: %w", err)
	}
	s := &server{out: os.Stdout, socket: filepath.Join(relayMount, socket), cancels: map[uint64]context.CancelFunc{}}
	return s.serve(os.Stdin)
}

// confine leaves the child nothing of the agent's before it opens a connection to the launcher:
// its root is an empty read-only tmpfs holding the relay's directory alone, it runs as
// ChildUID:ChildGID with no supplementary group and no capability, may gain none (no new
// privileges), is not dumpable, and dies with the agent. The agent made its mount, network, PID
// and IPC namespaces (Start); the container's seccomp profile is inherited, and narrowed by the
// child's own filter (childFilter).
func confine(dir string) error {
	// A child that a hostile daemon took over and that grows is the first the kernel kills when
	// the agent's container runs out of memory, not the agent.
	if err := os.WriteFile("/proc/self/oom_score_adj", []byte("1000"), 0); err != nil {
		return fmt.Errorf("raising the OOM score: %w", err)
	}
	// Nothing mounted below may reach the agent's mount namespace.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making mounts private: %w", err)
	}
	relay, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("opening the relay's directory: %w", err)
	}
	defer unix.Close(relay)
	// The new root is mounted over the relays' directory, which exists; the relay's own directory
	// is held open, so that it can still be bound below.
	root := filepath.Dir(dir)
	if err := unix.Mount("tmpfs", root, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=16k,mode=0755"); err != nil {
		return fmt.Errorf("mounting the new root: %w", err)
	}
	target := filepath.Join(root, relayMount)
	if err := unix.Mkdir(target, 0o755); err != nil {
		return fmt.Errorf("making the relay's mount point: %w", err)
	}
	if err := unix.Mount(fmt.Sprintf("/proc/self/fd/%d", relay), target, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("binding the relay's directory: %w", err)
	}
	if err := unix.Mount("", target, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("remounting the relay's directory nosuid, nodev, noexec: %w", err)
	}
	// The new root is moved over the old one, which it hides, and becomes the process's root, as
	// switch_root does: pivot_root(2) is not in the container runtime's default seccomp profile,
	// chroot(2) is (with CAP_SYS_CHROOT). With no capability left and no descriptor of the old
	// root, the child cannot leave it.
	if err := unix.Chdir(root); err != nil {
		return err
	}
	if err := unix.Mount(".", "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("moving the new root over the old: %w", err)
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("entering the new root: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return err
	}
	if err := unix.Mount("", "/", "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("making the new root read-only: %w", err)
	}
	// syscall's set*id change every thread's credentials (through libc with cgo).
	if err := syscall.Setgroups(nil); err != nil {
		return fmt.Errorf("dropping supplementary groups: %w", err)
	}
	if err := syscall.Setgid(ChildGID); err != nil {
		return fmt.Errorf("setgid: %w", err)
	}
	if err := syscall.Setuid(ChildUID); err != nil {
		return fmt.Errorf("setuid: %w", err)
	}
	// Leaving root cleared the permitted, effective and ambient sets; this clears the inheritable one.
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var none [2]unix.CapUserData
	if err := unix.Capset(&hdr, &none[0]); err != nil {
		return fmt.Errorf("clearing capabilities: %w", err)
	}
	// Changing credentials made the process dumpable again and cleared its parent-death signal.
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("becoming non-dumpable: %w", err)
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("setting no new privileges: %w", err)
	}
	// The container's seccomp profile is the agent's, which allows namespaces and mounts; the
	// child narrows it with its own (seccomp.go).
	if err := installFilter(); err != nil {
		return err
	}
	if err := unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(unix.SIGKILL), 0, 0, 0); err != nil {
		return fmt.Errorf("setting the parent-death signal: %w", err)
	}
	return checkConfined()
}

// checkConfined fails unless the drop above took: no capability, no root, no group.
func checkConfined() error {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var caps [2]unix.CapUserData
	if err := unix.Capget(&hdr, &caps[0]); err != nil {
		return fmt.Errorf("reading capabilities: %w", err)
	}
	ruid, euid, suid := unix.Getresuid()
	rgid, egid, sgid := unix.Getresgid()
	groups, err := unix.Getgroups()
	if err != nil {
		return fmt.Errorf("reading groups: %w", err)
	}
	return confinementProblem(caps, [6]int{ruid, euid, suid, rgid, egid, sgid}, groups)
}

// confinementProblem says what is wrong with a child's capabilities, its real, effective and
// saved user and group IDs and its supplementary groups; nil if nothing is.
func confinementProblem(caps [2]unix.CapUserData, ids [6]int, groups []int) error {
	for _, c := range caps {
		if c.Effective != 0 || c.Permitted != 0 || c.Inheritable != 0 {
			return fmt.Errorf("capabilities left: %+v", caps)
		}
	}
	for i, id := range ids {
		want := ChildUID
		if i >= 3 {
			want = ChildGID
		}
		if id != want {
			return fmt.Errorf("IDs %v, want user %d and group %d throughout", ids, ChildUID, ChildGID)
		}
	}
	if len(groups) != 0 {
		return fmt.Errorf("supplementary groups %v left", groups)
	}
	return nil
}

// server answers the agent's requests with one libvirt connection.
type server struct {
	socket string

	outMu sync.Mutex
	out   io.Writer

	conn      *domain.Conn
	cancelsMu sync.Mutex
	cancels   map[uint64]context.CancelFunc
}

// serve reads requests until the agent closes its end. The connection comes first; every other
// call runs on its own, as libvirt's connection takes concurrent calls.
func (s *server) serve(in io.Reader) error {
	r := newLineReader(in)
	for {
		line, err := r.next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("reading a request: %w", err)
		}
		var req request
		if err := json.Unmarshal(line, &req); err != nil {
			return fmt.Errorf("reading a request: %w", err)
		}
		switch {
		case req.Op == opConnect:
			s.answer(req.ID, nil, s.connect(req.Session))
		case req.Op == opCancel:
			s.cancelsMu.Lock()
			if cancel, ok := s.cancels[req.Target]; ok {
				cancel()
			}
			s.cancelsMu.Unlock()
		case s.conn == nil:
			s.answer(req.ID, nil, errors.New("not connected"))
		default:
			ctx, cancel := context.WithCancel(context.Background())
			s.cancelsMu.Lock()
			s.cancels[req.ID] = cancel
			s.cancelsMu.Unlock()
			go func() {
				v, err := s.call(ctx, req)
				s.cancelsMu.Lock()
				delete(s.cancels, req.ID)
				s.cancelsMu.Unlock()
				cancel()
				s.answer(req.ID, v, err)
			}()
		}
	}
}

// connect opens the connection and sends its domains' lifecycle events; the child exits when the
// daemon's side ends it.
func (s *server) connect(session bool) error {
	if s.conn != nil {
		return errors.New("already connected")
	}
	conn, err := domain.ConnectSocket(s.socket, session)
	if err != nil {
		return err
	}
	events, err := conn.Events(context.Background())
	if err != nil {
		_ = conn.Close()
		return err
	}
	s.conn = conn
	go func() {
		for ev := range events {
			s.send(reply{Event: &ev})
		}
		fmt.Fprintln(os.Stderr, "libvirt client: the launcher's libvirt closed the connection")
		os.Exit(0)
	}()
	return nil
}

func (s *server) call(ctx context.Context, req request) (any, error) {
	c, name := s.conn, req.Name
	switch req.Op {
	case opLookup:
		return c.Lookup(name)
	case opMetadata:
		return c.Metadata(name)
	case opState:
		st, r, err := c.State(name)
		return stateResult{st, r}, err
	case opDomainNames:
		return c.DomainNames()
	case opShutdown:
		return nil, c.Shutdown(name)
	case opDestroy:
		return nil, c.Destroy(name)
	case opMigrate:
		if req.Migrate == nil {
			return nil, errors.New("migrate: no options")
		}
		return nil, c.Migrate(ctx, name, *req.Migrate)
	case opJobStats:
		return c.JobStats(name)
	case opStartPostCopy:
		return nil, c.StartPostCopy(name)
	case opSuspend:
		return nil, c.Suspend(name)
	case opResume:
		return nil, c.Resume(name)
	case opLoadCapabilities:
		return nil, c.LoadQEMUCapabilities()
	case opStartDirtyRateCalc:
		return nil, c.StartDirtyRateCalc(name, req.Period, req.Mode)
	case opDirtyRate:
		rate, ok, err := c.DirtyRate(name)
		return dirtyRateResult{rate, ok}, err
	}
	return nil, fmt.Errorf("unknown operation %q", req.Op)
}

// answer sends the result of request id: v, or err.
func (s *server) answer(id uint64, v any, err error) {
	rep := reply{ID: id}
	if err != nil {
		rep.Error = &wireError{Message: err.Error(), NotFound: errors.Is(err, domain.ErrNotFound), Cancelled: errors.Is(err, context.Canceled)}
	} else if v != nil {
		b, err := json.Marshal(v)
		if err != nil {
			rep.Error = &wireError{Message: err.Error()}
		} else {
			rep.Result = b
		}
	}
	s.send(rep)
}

// send writes one message; a reply over MaxMessage becomes an error of its call instead.
func (s *server) send(rep reply) {
	line, err := encodeLine(rep)
	if err != nil && rep.ID != 0 {
		line, err = encodeLine(reply{ID: rep.ID, Error: &wireError{Message: err.Error()}})
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "libvirt client: dropping a message: %v\n", err)
		return
	}
	s.outMu.Lock()
	defer s.outMu.Unlock()
	if _, err := s.out.Write(line); err != nil {
		// The agent is gone or cut this child off.
		os.Exit(1)
	}
}
