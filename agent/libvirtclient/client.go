// Package libvirtclient runs libvirt's C client for the agent in a confined child process and
// speaks a small, memory-safe protocol with it. A launcher's libvirt daemon is the tenant's to
// replace (kubectl exec into its own launcher), and libvirt does not harden its client against a
// hostile daemon: a parsing bug in the agent's own process would be root on the node. So the agent
// never opens a libvirt connection itself. Per launcher connection it re-executes its own binary
// as a child (Start) in new mount, network, PID and IPC namespaces, which confines itself (an
// empty root holding only the relay's socket, nobody's user, no capability, no new privileges)
// before it connects, and answers the agent's requests in newline-delimited JSON, each message at
// most MaxMessage bytes. A message over the bound or malformed ends that child's connection, and
// that connection's only.
package libvirtclient

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lifeboat-vm/lifeboat/domain"
)

// Options say what a child connects to and where it reports.
type Options struct {
	// Dir is the relay's directory, the only thing of the agent's the child sees; Socket is the
	// name of the relay's socket in it. Both must be reachable by ChildUID.
	Dir, Socket string
	// Log receives the child's standard error, line by line.
	Log *slog.Logger
	// OnEvent is called with every lifecycle event of the connection's domains, in order, from the
	// goroutine that reads the child: it must not block.
	OnEvent func(domain.Event)
}

// Client is the agent's end of one child and its libvirt connection. Its methods are domain.Conn's
// and as safe for concurrent use.
type Client struct {
	w       io.Writer
	writeMu sync.Mutex
	onEvent func(domain.Event)
	kill    func()
	pid     int
	exited  chan struct{}
	session bool

	mu      sync.Mutex
	nextID  uint64
	pending map[uint64]chan reply
	err     error
	done    chan struct{}
}

// Errors a Client's calls end with once it has ended for these reasons.
var (
	ErrCut    = errors.New("cut by the agent")
	ErrClosed = errors.New("closed")
)

// Start starts a child for opts. It is not connected yet (Connect): its process ID (Pid) is there
// for the relay to admit first.
func Start(opts Options) (*Client, error) {
	log := opts.Log
	if log == nil {
		log = slog.Default()
	}
	var files []*os.File
	closeAll := func() {
		for _, f := range files {
			_ = f.Close()
		}
	}
	pipe := func() (r, w *os.File, err error) {
		r, w, err = os.Pipe()
		if err == nil {
			files = append(files, r, w)
		}
		return r, w, err
	}
	inR, inW, err := pipe()
	if err != nil {
		return nil, err
	}
	outR, outW, err := pipe()
	if err != nil {
		closeAll()
		return nil, err
	}
	errR, errW, err := pipe()
	if err != nil {
		closeAll()
		return nil, err
	}
	cmd := &exec.Cmd{
		// The agent's own binary, as it was started, whatever is at its path now.
		Path: "/proc/self/exe",
		Args: []string{"lifeboat-agent", childCommand, opts.Dir, opts.Socket},
		// No variable of the agent's: libvirt's client finds no configuration of a user and no
		// URI to fall back to, and needs no lookup of its user.
		Env:    []string{"HOME=/", "XDG_CONFIG_HOME=/", "XDG_CACHE_HOME=/", "XDG_RUNTIME_DIR=/", "LC_ALL=C"},
		Stdin:  inR,
		Stdout: outW,
		Stderr: errW,
		SysProcAttr: &syscall.SysProcAttr{
			// No network at all (a unix socket's path still reaches the relay), its own mounts to
			// leave the agent's behind, no view of the node's processes or IPC.
			Cloneflags: unix.CLONE_NEWNS | unix.CLONE_NEWNET | unix.CLONE_NEWPID | unix.CLONE_NEWIPC,
			Pdeathsig:  syscall.SIGKILL,
		},
	}
	if err := spawn(cmd); err != nil {
		closeAll()
		return nil, fmt.Errorf("starting the libvirt client: %w", err)
	}
	_, _, _ = inR.Close(), outW.Close(), errW.Close()
	exited := make(chan struct{})
	c := newClient(outR, inW, func() { _ = cmd.Process.Kill() }, opts.OnEvent)
	c.pid, c.exited = cmd.Process.Pid, exited
	go forwardStderr(errR, log)
	go func() {
		err := cmd.Wait()
		_ = inW.Close()
		close(exited)
		if err != nil && !errors.Is(c.Err(), ErrCut) && !errors.Is(c.Err(), ErrClosed) {
			log.Warn("the libvirt client exited", "pid", c.pid, "err", err)
		}
	}()
	return c, nil
}

// newClient is the agent's end of a child that reads requests from w and writes to r; kill ends
// the child; onEvent (nil: none) takes its events, set before the first is read.
func newClient(r io.ReadCloser, w io.Writer, kill func(), onEvent func(domain.Event)) *Client {
	c := &Client{w: w, onEvent: onEvent, pending: map[uint64]chan reply{}, done: make(chan struct{})}
	// Closing r ends the read under way, for a child that is not dead yet.
	c.kill = func() { kill(); _ = r.Close() }
	go func() {
		defer close(c.done)
		c.read(r)
	}()
	return c
}

// Pid is the child's process ID, as the agent sees it.
func (c *Client) Pid() int { return c.pid }

// Done is closed once the connection has ended (cut, closed, or ended by the child: its daemon
// went away, it exited, or it broke the protocol) and OnEvent is called no more. Err says why.
func (c *Client) Done() <-chan struct{} { return c.done }

// Err is why the connection ended; nil while it lasts.
func (c *Client) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// end ends the connection with err, if it has not ended yet: every waiting call fails with it,
// and the child is killed.
func (c *Client) end(err error) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	c.err = fmt.Errorf("the libvirt client's connection ended: %w", err)
	pending := c.pending
	c.pending = nil
	c.mu.Unlock()
	for _, ch := range pending {
		close(ch)
	}
	c.kill()
}

// Cut ends the connection at once: its calls fail with ErrCut, and the child is killed.
func (c *Client) Cut() { c.end(ErrCut) }

// Close ends the connection and waits for the child to exit.
func (c *Client) Close() error {
	c.end(ErrClosed)
	if c.exited != nil {
		<-c.exited
	}
	return nil
}

// read takes the child's messages until it ends or breaks the protocol.
func (c *Client) read(r io.Reader) {
	lines := newLineReader(r)
	for {
		line, err := lines.next()
		if err != nil {
			c.end(err)
			return
		}
		var rep reply
		if err := json.Unmarshal(line, &rep); err != nil {
			c.end(fmt.Errorf("a malformed message: %w", err))
			return
		}
		if rep.ID == 0 {
			if rep.Event == nil {
				c.end(errors.New("a message that answers no request and is no event"))
				return
			}
			if c.onEvent != nil {
				c.onEvent(*rep.Event)
			}
			continue
		}
		c.mu.Lock()
		ch, ok := c.pending[rep.ID]
		delete(c.pending, rep.ID)
		c.mu.Unlock()
		if !ok {
			c.end(fmt.Errorf("an answer to request %d, which does not wait for one", rep.ID))
			return
		}
		ch <- rep
	}
}

func (c *Client) send(req request) error {
	line, err := encodeLine(req)
	if err != nil {
		return err
	}
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	_, err = c.w.Write(line)
	return err
}

// call sends req and decodes its result into out (if not nil). ctx's end is passed on to the
// child (which cancels the call, a migration) and the call waits for the child's answer.
func (c *Client) call(ctx context.Context, req request, out any) error {
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return err
	}
	c.nextID++
	req.ID = c.nextID
	ch := make(chan reply, 1)
	c.pending[req.ID] = ch
	c.mu.Unlock()
	if err := c.send(req); err != nil {
		c.end(fmt.Errorf("writing a request: %w", err))
		return c.Err()
	}
	cancelled := ctx.Done()
	for {
		select {
		case rep, ok := <-ch:
			if !ok {
				return c.Err()
			}
			if e := rep.Error; e != nil {
				return remoteError(ctx, e)
			}
			if out == nil {
				return nil
			}
			if err := json.Unmarshal(rep.Result, out); err != nil {
				c.end(fmt.Errorf("a malformed result of %s: %w", req.Op, err))
				return c.Err()
			}
			return nil
		case <-cancelled:
			cancelled = nil
			if err := c.send(request{Op: opCancel, Target: req.ID}); err != nil {
				c.end(fmt.Errorf("writing a request: %w", err))
			}
		}
	}
}

// callError is a call's failure as the child reported it.
type callError struct {
	msg     string
	wrapped error
}

func (e *callError) Error() string { return e.msg }
func (e *callError) Unwrap() error { return e.wrapped }

// remoteError is the child's error e, wrapping what the agent tells apart: domain.ErrNotFound,
// and ctx's error for a call cancelled through ctx.
func remoteError(ctx context.Context, e *wireError) error {
	switch {
	case e.NotFound:
		return &callError{e.Message, domain.ErrNotFound}
	case e.Cancelled && ctx.Err() != nil:
		return &callError{e.Message, ctx.Err()}
	}
	return &callError{msg: e.Message}
}

// Connect has the child confine itself and connect to the daemon through the relay, a session
// daemon's driver if session; it fails with ctx's error if ctx ends first (the caller then cuts).
func (c *Client) Connect(ctx context.Context, session bool) error {
	c.session = session
	done := make(chan error, 1)
	go func() { done <- c.call(context.Background(), request{Op: opConnect, Session: session}, nil) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Session reports whether the daemon is a session daemon (Connect's).
func (c *Client) Session() bool { return c.session }

func (c *Client) named(op, name string, out any) error {
	return c.call(context.Background(), request{Op: op, Name: name}, out)
}

func (c *Client) Lookup(name string) (domain.Info, error) {
	var info domain.Info
	return info, c.named(opLookup, name, &info)
}

func (c *Client) Metadata(name string) (domain.Metadata, error) {
	var md domain.Metadata
	return md, c.named(opMetadata, name, &md)
}

func (c *Client) State(name string) (domain.State, domain.Reason, error) {
	var r stateResult
	if err := c.named(opState, name, &r); err != nil {
		return domain.NoState, domain.ReasonUnknown, err
	}
	return r.State, r.Reason, nil
}

func (c *Client) DomainNames() ([]string, error) {
	var names []string
	return names, c.named(opDomainNames, "", &names)
}

func (c *Client) Shutdown(name string) error      { return c.named(opShutdown, name, nil) }
func (c *Client) Destroy(name string) error       { return c.named(opDestroy, name, nil) }
func (c *Client) StartPostCopy(name string) error { return c.named(opStartPostCopy, name, nil) }
func (c *Client) Suspend(name string) error       { return c.named(opSuspend, name, nil) }
func (c *Client) Resume(name string) error        { return c.named(opResume, name, nil) }
func (c *Client) LoadQEMUCapabilities() error     { return c.named(opLoadCapabilities, "", nil) }

func (c *Client) JobStats(name string) (domain.JobStats, error) {
	var s domain.JobStats
	return s, c.named(opJobStats, name, &s)
}

// Migrate is domain.Conn.Migrate in the child; ctx's end aborts the migration there.
func (c *Client) Migrate(ctx context.Context, name string, opts domain.MigrateOptions) error {
	return c.call(ctx, request{Op: opMigrate, Name: name, Migrate: &opts}, nil)
}

func (c *Client) StartDirtyRateCalc(name string, period time.Duration, mode domain.DirtyRateMode) error {
	return c.call(context.Background(), request{Op: opStartDirtyRateCalc, Name: name, Period: period, Mode: mode}, nil)
}

func (c *Client) DirtyRate(name string) (uint64, bool, error) {
	var r dirtyRateResult
	err := c.named(opDirtyRate, name, &r)
	return r.Rate, r.OK, err
}

// Bounds of a child's standard error in the agent's log: a line's length, and how many lines.
const (
	maxStderrLine  = 2048
	maxStderrLines = 200
)

// forwardStderr logs the child's standard error a line at a time, each cut at maxStderrLine bytes,
// and the first maxStderrLines lines only.
func forwardStderr(r io.ReadCloser, log *slog.Logger) {
	defer r.Close()
	br := bufio.NewReaderSize(r, maxStderrLine)
	logged, rest := 0, false // rest: the line read is the rest of one already logged cut
	for {
		line, err := br.ReadSlice('\n')
		cut := errors.Is(err, bufio.ErrBufferFull)
		if len(line) > 0 && !rest {
			switch {
			case logged < maxStderrLines:
				log.Warn("the libvirt client says", "line", strings.TrimSuffix(string(line), "\n"), "cut", cut)
			case logged == maxStderrLines:
				log.Warn("the libvirt client says more; the rest of its output is dropped")
			}
			logged++
		}
		rest = cut
		if err != nil && !cut {
			return
		}
	}
}

// spawns are Start's children to start, on spawnThread.
var spawns = make(chan spawn1)

type spawn1 struct {
	cmd  *exec.Cmd
	done chan error
}

var startSpawner = sync.OnceFunc(func() { go spawnThread() })

// spawnThread starts the children, from one OS thread that lives as long as the agent: a child's
// parent-death signal is sent when the thread that started it ends, not the process, and the
// Go runtime ends a thread a goroutine locked and did not unlock. The thread has no new
// privileges, which its children inherit; the agent's other threads are left as they are.
func spawnThread() {
	runtime.LockOSThread() // for ever
	nnp := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
	for s := range spawns {
		if nnp != nil {
			s.done <- fmt.Errorf("setting no new privileges: %w", nnp)
			continue
		}
		s.done <- s.cmd.Start()
	}
}

func spawn(cmd *exec.Cmd) error {
	startSpawner()
	done := make(chan error, 1)
	spawns <- spawn1{cmd, done}
	return <-done
}
