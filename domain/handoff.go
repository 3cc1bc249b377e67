package domain

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// HandoffResult is how HandOff ended.
type HandoffResult string

const (
	// HandoffResumed: the source's QEMU ended with the guest paused, and the guest now runs on
	// the destination.
	HandoffResumed HandoffResult = "ResumedAtDestination"
	// HandoffSourceRuns: the guest runs on the source again (libvirt resumed it after a failed
	// migration, or lifeboat did), so the destination's copy must never run.
	HandoffSourceRuns HandoffResult = "SourceRuns"
	// HandoffNoGuest: the source's QEMU ended, and the destination holds no guest that arrived
	// whole (the migration failed before its end).
	HandoffNoGuest HandoffResult = "NoGuestAtDestination"
	// HandoffAlreadyRunning: the destination runs the guest already (a post-copy migration, or
	// one not made with PausedOnArrival).
	HandoffAlreadyRunning HandoffResult = "AlreadyRunningAtDestination"
)

// ErrForwardClosed is why a hand-off failed when the socket it reaches the destination through
// was gone: the source's agent removes the migration's forward once it has recorded the
// migration's outcome, and the target's agent then runs a guest that arrived. So a launcher
// slower than its agent (a node short of CPU) ends here after a migration that succeeded.
var ErrForwardClosed = errors.New("the forward to the migration's destination is closed")

// handoffWait bounds what follows the source QEMU's end: reaching the destination's daemon and
// waiting for it to finish receiving the guest. libvirt ends the source's QEMU only after the
// destination's Finish step, so that wait is long only when QEMU ended otherwise (killed
// mid-migration) and the destination's daemon is still winding the migration down, or when the
// link to the destination hangs.
const handoffWait = 30 * time.Second

// HandOff is the source's half of a migration made with PausedOnArrival. It watches the named
// domain, paused on conn at the switch-over, and its QEMU (qemuPid): once that QEMU has ended
// without the guest running here again, it resumes the guest at the destination daemon
// destURI, where the migration left it paused.
//
// Why the QEMU's end: libvirt's source daemon stops its QEMU only once the destination has
// confirmed that it holds the guest, and resumes the guest here when it does not hear that
// confirmation, even when the destination has it (the connection between the nodes broke in
// between; libvirt leaves that case to a lock manager on storage both nodes share). A guest
// that runs here again, or a QEMU still alive, leaves the destination's copy paused; a
// destination pod that is then deleted takes it with it. A QEMU that ended otherwise (killed)
// after the destination confirmed leaves the destination's the only copy, which is resumed.
func HandOff(ctx context.Context, conn *Conn, name string, qemuPid int, destURI string) (HandoffResult, error) {
	events, err := conn.DomainEvents(ctx, name)
	if err != nil {
		return "", fmt.Errorf("handing domain %q off: %w", name, err)
	}
	if state, _, err := conn.State(name); err == nil && state == Running {
		return HandoffSourceRuns, nil
	}
	// Connected while the final copy runs, so the resume costs one call.
	dialed := make(chan *Conn, 1)
	go func() {
		dest, _ := connectURI(destURI) // dialed again once QEMU has ended, if this failed
		dialed <- dest
	}()
	// Closed here if the hand-off ends before it is used.
	settled := false
	defer func() {
		if !settled {
			go func() {
				if d := <-dialed; d != nil {
					_ = d.Close()
				}
			}()
		}
	}()

	ended, err := processEnded(ctx, qemuPid)
	if err != nil {
		return "", fmt.Errorf("handing domain %q off: %w", name, err)
	}
wait:
	for {
		select {
		case ev, ok := <-events:
			if decided, r, err := sourceSays(name, ev, ok); decided {
				return r, err
			}
		case <-ended:
			break wait
		case <-ctx.Done():
			return "", fmt.Errorf("handing domain %q off: %w", name, ctx.Err())
		}
	}
	// A resume that came just before the QEMU was killed is still queued.
	for drained := false; !drained; {
		select {
		case ev, ok := <-events:
			if decided, r, err := sourceSays(name, ev, ok); decided {
				return r, err
			}
		default:
			drained = true
		}
	}
	settled = true
	// A call to a destination that no longer answers could wait for libvirt's keepalive: the
	// hand-off gives up at handoffWait, and the resume, should it still come, is as right then.
	type outcome struct {
		r   HandoffResult
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		d := <-dialed
		if d == nil {
			var err error
			if d, err = connectURI(destURI); err != nil {
				done <- outcome{err: forwardClosed(destURI, fmt.Errorf("handing domain %q off: the source's QEMU ended: %w", name, err))}
				return
			}
		}
		defer d.Close()
		r, err := resumeArrived(ctx, d, name)
		if err != nil {
			err = forwardClosed(destURI, err)
		}
		done <- outcome{r, err}
	}()
	select {
	case o := <-done:
		return o.r, o.err
	case <-time.After(handoffWait):
		return "", fmt.Errorf("handing domain %q off: the source's QEMU ended, and the destination did not answer within %s", name, handoffWait)
	case <-ctx.Done():
		return "", fmt.Errorf("handing domain %q off: %w", name, ctx.Err())
	}
}

// forwardClosed is err, marked ErrForwardClosed when the unix socket destURI names is gone.
// A socket still there (its agent restarted, or the call failed otherwise) leaves err as it is.
func forwardClosed(destURI string, err error) error {
	u, perr := url.Parse(destURI)
	if perr != nil {
		return err
	}
	socket := u.Query().Get("socket")
	if socket == "" {
		return err
	}
	if _, serr := os.Stat(socket); errors.Is(serr, fs.ErrNotExist) {
		return fmt.Errorf("%w: %w", ErrForwardClosed, err)
	}
	return err
}

// sourceSays is what one of the source's events (ok false: the stream's end) decides for the
// hand-off of domain name, if anything: the guest running there again, or the source out of sight.
func sourceSays(name string, ev Event, ok bool) (decided bool, r HandoffResult, err error) {
	switch {
	case !ok:
		// The source's daemon went away: a new one could run the guest again unseen. The
		// destination's copy stays paused; the target's agent runs it once the source's agent
		// records the migration complete.
		return true, "", fmt.Errorf("handing domain %q off: the source's libvirt connection ended before its QEMU was seen to", name)
	case ev.Domain == name && ev.State == Running:
		return true, HandoffSourceRuns, nil
	}
	return false, "", nil
}

// resumeArrived resumes the named guest on dest once its migration there has finished with the
// guest paused (reason User: PausedOnArrival), and reports what it found otherwise.
func resumeArrived(ctx context.Context, dest *Conn, name string) (HandoffResult, error) {
	ctx, cancel := context.WithTimeout(ctx, handoffWait)
	defer cancel()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		state, reason, err := dest.State(name)
		switch {
		case errors.Is(err, ErrNotFound), err == nil && state != Paused && state != Running:
			return HandoffNoGuest, nil
		case err == nil && state == Running:
			return HandoffAlreadyRunning, nil
		case err == nil && reason == ReasonUser:
			if err := dest.Resume(name); err != nil {
				return "", fmt.Errorf("handing domain %q off: the source's QEMU ended: %w", name, err)
			}
			return HandoffResumed, nil
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return "", fmt.Errorf("handing domain %q off: the source's QEMU ended, and the destination's last state was %s (%s), error %v: %w",
				name, state, reason, err, ctx.Err())
		}
	}
}

// processEnded returns a channel closed once the process pid has ended, watched through a pidfd
// opened now: the caller knows pid was alive a moment ago, and a pid reused after that is not
// mistaken for it later.
func processEnded(ctx context.Context, pid int) (<-chan struct{}, error) {
	ended := make(chan struct{})
	fd, err := unix.PidfdOpen(pid, 0)
	if errors.Is(err, unix.ESRCH) {
		close(ended)
		return ended, nil
	}
	if err != nil {
		return nil, fmt.Errorf("watching process %d: %w", pid, err)
	}
	go func() {
		defer unix.Close(fd)
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		for ctx.Err() == nil {
			// Bounded, so that the watch ends with ctx.
			n, err := unix.Poll(fds, 100)
			if n > 0 {
				close(ended)
				return
			}
			if err != nil && !errors.Is(err, unix.EINTR) {
				// Not known to have ended: the caller waits for ctx.
				return
			}
		}
	}()
	return ended, nil
}

// Handoffs runs HandOff for each pause of one domain on the source, one at a time: the owner of
// the source's event stream passes every event to Observe.
type Handoffs struct {
	ctx     context.Context
	name    string
	destURI string
	qemuPid func() (int, error)
	report  func(HandoffResult, error)

	mu      sync.Mutex
	running chan struct{} // closed when the HandOff in flight returns; nil when none is
}

// NewHandoffs hands the named domain off to destURI, reading its QEMU's pid with qemuPid at
// each pause and passing each HandOff's outcome to report, until ctx ends.
func NewHandoffs(ctx context.Context, name, destURI string, qemuPid func() (int, error), report func(HandoffResult, error)) *Handoffs {
	return &Handoffs{ctx: ctx, name: name, destURI: destURI, qemuPid: qemuPid, report: report}
}

// Observe starts a HandOff on conn when ev pauses the domain and none is in flight.
func (h *Handoffs) Observe(conn *Conn, ev Event) {
	if ev.Domain != h.name || ev.State != Paused {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.running != nil {
		return
	}
	done := make(chan struct{})
	h.running = done
	go func() {
		defer func() {
			h.mu.Lock()
			h.running = nil
			h.mu.Unlock()
			close(done)
		}()
		pid, err := h.qemuPid()
		if err != nil {
			h.report("", fmt.Errorf("handing domain %q off: %w", h.name, err))
			return
		}
		h.report(HandOff(h.ctx, conn, h.name, pid, h.destURI))
	}()
}

// Wait returns once no HandOff is in flight, or ctx ends.
func (h *Handoffs) Wait(ctx context.Context) {
	h.mu.Lock()
	running := h.running
	h.mu.Unlock()
	if running == nil {
		return
	}
	select {
	case <-running:
	case <-ctx.Done():
	}
}
