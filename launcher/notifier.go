package launcher

import (
	"context"
	"log/slog"
	"net"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/lifeboat-vm/lifeboat/api/notify"
)

// A launcher often starts before its agent has linked the pod's run volume, where the agent's
// socket appears: the first dials are retried soon, so that its Hello and reports (each starts
// a sync of its VMI on the agent) do not wait a whole interval after the link; an agent that
// is down is retried every maxDialRetry.
const (
	firstDialRetry = 20 * time.Millisecond
	maxDialRetry   = 500 * time.Millisecond
)

// Notifier keeps the launcher's reports flowing to the agent. The agent may restart at any
// time, so on every (re)connection it sends Hello and then every report made so far, in order;
// the agent treats reports as idempotent observations.
type Notifier struct {
	socket string
	vmi    notify.VMIRef
	log    *slog.Logger

	mu        sync.Mutex
	history   []*notify.Message
	delivered int // of history, on the current connection
	// connected is closed when the current connection to the agent ends; closed while there
	// is none.
	connected chan struct{}
	wake      chan struct{}

	handoverDone chan struct{}
	handoverOnce sync.Once

	// guestMemory reads the guest's RAM for the agent's KindGuestMemoryQuery: nil until the
	// guest runs here.
	guestMemory func() (resident, size uint64, err error)
	// answers are the current connection's answers not yet written: unlike reports they are
	// not kept for the next connection, whose agent asks again.
	answers []*notify.Message
}

// NewNotifier makes a notifier for the agent's socket at path.
func NewNotifier(path string, vmi notify.VMIRef, log *slog.Logger) *Notifier {
	ended := make(chan struct{})
	close(ended)
	return &Notifier{socket: path, vmi: vmi, log: log, wake: make(chan struct{}, 1), connected: ended, handoverDone: make(chan struct{})}
}

// HandoverDone is closed once the agent has said that this launcher's pod is no longer needed
// after its guest left by migration (notify.KindHandoverDone).
func (n *Notifier) HandoverDone() <-chan struct{} { return n.handoverDone }

// Connection is closed when the connection to the agent that is open now ends, or at once if
// none is: what an agent said it would tell, a restarted one will not.
func (n *Notifier) Connection() <-chan struct{} {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.connected
}

// Report queues a message and sends it at once if the agent is connected. It never blocks on the agent.
func (n *Notifier) Report(kind notify.Kind, at time.Time, podGrace int64, reason string) {
	n.queue(&notify.Message{Kind: kind, VMI: n.vmi, Time: at, PodGracePeriodSeconds: podGrace, Reason: reason})
}

// ReportMigrated queues how long the migration that brought the guest here stopped it.
func (n *Notifier) ReportMigrated(at time.Time, downtime time.Duration) {
	n.queue(&notify.Message{Kind: notify.KindMigrated, VMI: n.vmi, Time: at, DowntimeMilliseconds: downtime.Milliseconds()})
}

// AnswerGuestMemory makes the launcher answer the agent's questions about the guest's RAM (how
// much of it is resident, and its size) with what read says.
func (n *Notifier) AnswerGuestMemory(read func() (resident, size uint64, err error)) {
	n.mu.Lock()
	n.guestMemory = read
	n.mu.Unlock()
}

// answerGuestMemory queues the answer to a KindGuestMemoryQuery; nothing when the launcher
// cannot tell, and the agent then bounds the guest's memory in use without it.
func (n *Notifier) answerGuestMemory() {
	n.mu.Lock()
	read := n.guestMemory
	n.mu.Unlock()
	if read == nil {
		return
	}
	resident, size, err := read()
	if err != nil {
		n.log.Debug("the agent asked for the guest's resident memory, which cannot be read", "err", err)
		return
	}
	n.mu.Lock()
	n.answers = append(n.answers, &notify.Message{Kind: notify.KindGuestMemory, VMI: n.vmi, Time: time.Now(),
		GuestMemoryResidentBytes: resident, GuestMemoryBytes: size})
	n.mu.Unlock()
	n.wakeUp()
}

func (n *Notifier) queue(m *notify.Message) {
	n.mu.Lock()
	n.history = append(n.history, m)
	n.mu.Unlock()
	n.wakeUp()
}

func (n *Notifier) wakeUp() {
	select {
	case n.wake <- struct{}{}:
	default:
	}
}

// Flush waits until every report so far was written to the agent, or until timeout: the
// launcher's last words must not be lost to its exit, but an absent agent must not hold it.
func (n *Notifier) Flush(timeout time.Duration) bool {
	err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		n.mu.Lock()
		defer n.mu.Unlock()
		return n.delivered == len(n.history), nil
	})
	return err == nil
}

// Run connects, sends and reconnects until ctx ends.
func (n *Notifier) Run(ctx context.Context) {
	retry := firstDialRetry
	for ctx.Err() == nil {
		conn, err := (&net.Dialer{}).DialContext(ctx, "unix", n.socket)
		if err != nil {
			select {
			case <-ctx.Done():
				return
			case <-time.After(retry):
			}
			retry = min(2*retry, maxDialRetry)
			continue
		}
		retry = firstDialRetry
		n.log.Info("connected to the agent", "socket", n.socket)
		n.serve(ctx, conn)
		conn.Close()
	}
}

// serve sends Hello and the history, then each new report, until the connection fails.
func (n *Notifier) serve(ctx context.Context, conn net.Conn) {
	// The agent writes only what it tells the launcher; a read failing means the connection
	// ended, and so does a frame the launcher cannot read.
	closed := make(chan struct{})
	n.mu.Lock()
	n.connected = closed
	n.mu.Unlock()
	go func() {
		defer close(closed)
		for {
			m, err := notify.Read(conn)
			if err != nil {
				return
			}
			switch {
			case m.VMI != n.vmi:
			case m.Kind == notify.KindHandoverDone:
				n.log.Info("the agent says the pod is no longer needed", "reason", m.Reason)
				n.handoverOnce.Do(func() { close(n.handoverDone) })
			case m.Kind == notify.KindGuestMemoryQuery:
				n.answerGuestMemory()
			}
		}
	}()
	defer func() {
		// serve returns on a failed write too; the reader ends with the connection's close.
		conn.Close()
		<-closed
	}()
	if err := notify.Write(conn, &notify.Message{Kind: notify.KindHello, VMI: n.vmi, Time: time.Now()}); err != nil {
		return
	}
	n.mu.Lock()
	n.delivered = 0
	n.mu.Unlock()
	for {
		n.mu.Lock()
		pending := n.history[n.delivered:]
		n.mu.Unlock()
		for _, m := range pending {
			if err := notify.Write(conn, m); err != nil {
				n.log.Warn("lost the agent connection", "err", err)
				return
			}
			n.mu.Lock()
			n.delivered++
			n.mu.Unlock()
		}
		n.mu.Lock()
		answers := n.answers
		n.answers = nil
		n.mu.Unlock()
		for _, m := range answers {
			if err := notify.Write(conn, m); err != nil {
				n.log.Warn("lost the agent connection", "err", err)
				return
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-closed:
			n.log.Warn("the agent closed the connection")
			return
		case <-n.wake:
		}
	}
}
