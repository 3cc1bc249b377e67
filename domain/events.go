package domain

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	"libvirt.org/go/libvirt"
)

// EventType is the kind of a lifecycle event, as libvirt names them.
type EventType string

const (
	EventDefined     EventType = "Defined"
	EventUndefined   EventType = "Undefined"
	EventStarted     EventType = "Started"
	EventSuspended   EventType = "Suspended"
	EventResumed     EventType = "Resumed"
	EventStopped     EventType = "Stopped"
	EventShutdown    EventType = "Shutdown"
	EventPMSuspended EventType = "PMSuspended"
	EventCrashed     EventType = "Crashed"
)

// Event is a domain lifecycle event. State and Reason are what the event leaves the domain
// in; they are NoState for events that do not change the state (Defined, Undefined).
type Event struct {
	Domain string
	Type   EventType
	State  State
	Reason Reason
}

// eventRule is what one libvirt event type means: its name, the state it leaves, and
// what its detail codes say.
type eventRule struct {
	typ     EventType
	state   State
	reasons map[int]Reason
}

var eventRules = map[libvirt.DomainEventType]eventRule{
	libvirt.DOMAIN_EVENT_DEFINED:   {typ: EventDefined, state: NoState},
	libvirt.DOMAIN_EVENT_UNDEFINED: {typ: EventUndefined, state: NoState},
	libvirt.DOMAIN_EVENT_STARTED: {typ: EventStarted, state: Running, reasons: map[int]Reason{
		int(libvirt.DOMAIN_EVENT_STARTED_BOOTED):        ReasonBooted,
		int(libvirt.DOMAIN_EVENT_STARTED_MIGRATED):      ReasonMigrated,
		int(libvirt.DOMAIN_EVENT_STARTED_RESTORED):      ReasonRestored,
		int(libvirt.DOMAIN_EVENT_STARTED_FROM_SNAPSHOT): ReasonFromSnapshot,
		int(libvirt.DOMAIN_EVENT_STARTED_WAKEUP):        ReasonWakeUp,
	}},
	libvirt.DOMAIN_EVENT_SUSPENDED: {typ: EventSuspended, state: Paused, reasons: map[int]Reason{
		int(libvirt.DOMAIN_EVENT_SUSPENDED_PAUSED):          ReasonUser,
		int(libvirt.DOMAIN_EVENT_SUSPENDED_MIGRATED):        ReasonMigration,
		int(libvirt.DOMAIN_EVENT_SUSPENDED_IOERROR):         ReasonIOError,
		int(libvirt.DOMAIN_EVENT_SUSPENDED_WATCHDOG):        ReasonWatchdog,
		int(libvirt.DOMAIN_EVENT_SUSPENDED_RESTORED):        ReasonRestored,
		int(libvirt.DOMAIN_EVENT_SUSPENDED_FROM_SNAPSHOT):   ReasonFromSnapshot,
		int(libvirt.DOMAIN_EVENT_SUSPENDED_API_ERROR):       ReasonAPIError,
		int(libvirt.DOMAIN_EVENT_SUSPENDED_POSTCOPY):        ReasonPostcopy,
		int(libvirt.DOMAIN_EVENT_SUSPENDED_POSTCOPY_FAILED): ReasonPostcopyFailed,
	}},
	libvirt.DOMAIN_EVENT_RESUMED: {typ: EventResumed, state: Running, reasons: map[int]Reason{
		int(libvirt.DOMAIN_EVENT_RESUMED_UNPAUSED):        ReasonUnpaused,
		int(libvirt.DOMAIN_EVENT_RESUMED_MIGRATED):        ReasonMigrated,
		int(libvirt.DOMAIN_EVENT_RESUMED_FROM_SNAPSHOT):   ReasonFromSnapshot,
		int(libvirt.DOMAIN_EVENT_RESUMED_POSTCOPY):        ReasonPostcopy,
		int(libvirt.DOMAIN_EVENT_RESUMED_POSTCOPY_FAILED): ReasonPostcopyFailed,
	}},
	libvirt.DOMAIN_EVENT_STOPPED: {typ: EventStopped, state: Shutoff, reasons: map[int]Reason{
		int(libvirt.DOMAIN_EVENT_STOPPED_SHUTDOWN):      ReasonShutdown,
		int(libvirt.DOMAIN_EVENT_STOPPED_DESTROYED):     ReasonDestroyed,
		int(libvirt.DOMAIN_EVENT_STOPPED_CRASHED):       ReasonCrashed,
		int(libvirt.DOMAIN_EVENT_STOPPED_MIGRATED):      ReasonMigrated,
		int(libvirt.DOMAIN_EVENT_STOPPED_SAVED):         ReasonSaved,
		int(libvirt.DOMAIN_EVENT_STOPPED_FAILED):        ReasonFailed,
		int(libvirt.DOMAIN_EVENT_STOPPED_FROM_SNAPSHOT): ReasonFromSnapshot,
	}},
	libvirt.DOMAIN_EVENT_SHUTDOWN: {typ: EventShutdown, state: ShuttingDown, reasons: map[int]Reason{
		int(libvirt.DOMAIN_EVENT_SHUTDOWN_FINISHED): ReasonShutdown,
		int(libvirt.DOMAIN_EVENT_SHUTDOWN_GUEST):    ReasonGuest,
		int(libvirt.DOMAIN_EVENT_SHUTDOWN_HOST):     ReasonHost,
	}},
	libvirt.DOMAIN_EVENT_PMSUSPENDED: {typ: EventPMSuspended, state: PMSuspended},
	libvirt.DOMAIN_EVENT_CRASHED: {typ: EventCrashed, state: Crashed, reasons: map[int]Reason{
		int(libvirt.DOMAIN_EVENT_CRASHED_PANICKED): ReasonPanicked,
	}},
}

// eventFromLibvirt maps a libvirt lifecycle event of the named domain.
func eventFromLibvirt(name string, e libvirt.DomainEventLifecycle) Event {
	rule, ok := eventRules[e.Event]
	if !ok {
		return Event{Domain: name, Type: EventType(fmt.Sprintf("Unknown(%d)", e.Event)), State: NoState, Reason: ReasonUnknown}
	}
	return Event{Domain: name, Type: rule.typ, State: rule.state, Reason: reasonOf(rule.reasons, e.Detail)}
}

// Events streams the lifecycle events of every domain of the connection until ctx ends or
// the connection closes (Close, or the daemon went away), and then closes the channel.
// The stream never blocks libvirt's event loop: events queue until they are read.
func (c *Conn) Events(ctx context.Context) (<-chan Event, error) {
	return c.events(ctx, nil)
}

// DomainEvents is Events of the named domain alone. libvirt takes one stream of every domain per
// connection, and one more per domain.
func (c *Conn) DomainEvents(ctx context.Context, name string) (<-chan Event, error) {
	dom, err := c.lookup(name)
	if err != nil {
		return nil, err
	}
	defer dom.Free()
	return c.events(ctx, dom)
}

func (c *Conn) events(ctx context.Context, dom *libvirt.Domain) (<-chan Event, error) {
	q := newEventQueue()
	id, err := c.virt.DomainEventLifecycleRegister(dom, func(_ *libvirt.Connect, d *libvirt.Domain, e *libvirt.DomainEventLifecycle) {
		name, err := d.GetName()
		if err != nil {
			slog.Error("reading the name of a domain in a lifecycle event", "err", err)
			return
		}
		q.push(eventFromLibvirt(name, *e))
	})
	if err != nil {
		return nil, fmt.Errorf("registering for domain lifecycle events on %s: %w", c.uri, err)
	}
	out := make(chan Event)
	c.streams.Add(1)
	go func() {
		defer c.streams.Done()
		defer close(out)
		q.forward(ctx, c.closing, out)
		// Close waits for this, so the connection is still open here; it fails only when the
		// daemon went away, and then there is nothing to deregister from.
		if err := c.virt.DomainEventDeregister(id); err != nil && !c.lost() {
			slog.Error("deregistering domain lifecycle events", "uri", c.uri, "err", err)
		}
	}()
	return out, nil
}

// eventQueue holds events between libvirt's event loop, which must not block, and a reader.
type eventQueue struct {
	mu      sync.Mutex
	events  []Event
	pending chan struct{} // has a value while events is not empty
}

func newEventQueue() *eventQueue { return &eventQueue{pending: make(chan struct{}, 1)} }

func (q *eventQueue) push(e Event) {
	q.mu.Lock()
	q.events = append(q.events, e)
	q.mu.Unlock()
	select {
	case q.pending <- struct{}{}:
	default:
	}
}

// forward sends queued events to out, in order, until ctx ends or closed is closed.
func (q *eventQueue) forward(ctx context.Context, closed <-chan struct{}, out chan<- Event) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-closed:
			return
		case <-q.pending:
		}
		q.mu.Lock()
		events := q.events
		q.events = nil
		q.mu.Unlock()
		for _, e := range events {
			select {
			case out <- e:
			case <-ctx.Done():
				return
			case <-closed:
				return
			}
		}
	}
}
