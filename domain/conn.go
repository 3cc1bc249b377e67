package domain

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
	"libvirt.org/go/libvirt"
)

// ErrNotFound is wrapped by the errors of operations on a domain that does not exist.
var ErrNotFound = errors.New("domain not found")

// Conn is a connection to a libvirt daemon. Its methods name domains by name. It is safe
// for concurrent use, as libvirt connections are.
type Conn struct {
	virt *libvirt.Connect
	uri  string

	// closing is closed when Close is called or the daemon goes away; event streams end then.
	closing   chan struct{}
	closeOnce sync.Once
	lostMu    sync.Mutex
	isLost    bool
	// streams counts event streams, which Close waits for so none uses a closed connection.
	streams sync.WaitGroup
}

// SocketURI is the URI of the QEMU driver of the daemon listening on socketPath: the session
// driver of a session daemon, the system driver of a system daemon (see daemonLayout).
func SocketURI(socketPath string, session bool) string {
	if session {
		return "qemu+unix:///session?socket=" + socketPath
	}
	return "qemu+unix:///system?socket=" + socketPath
}

// Connect opens a connection to the libvirt daemon listening on socketPath, such as a
// private daemon's Libvirtd.Socket(). A daemon's socket belongs to the user it runs as, so
// the socket's owner says which driver to ask for: root's daemon is a system daemon.
func Connect(socketPath string) (*Conn, error) {
	session, err := SessionSocket(socketPath)
	if err != nil {
		return nil, err
	}
	return connectURI(SocketURI(socketPath, session))
}

// SessionSocket reports whether the daemon listening on socketPath is a session daemon: its
// socket belongs to a user other than root.
func SessionSocket(socketPath string) (bool, error) {
	var st unix.Stat_t
	if err := unix.Stat(socketPath, &st); err != nil {
		return false, fmt.Errorf("connecting to libvirt at %s: %w", socketPath, err)
	}
	return st.Uid != 0, nil
}

// ConnectSocket opens a connection to the libvirt daemon reached through socketPath, of the
// kind session says (SessionSocket of the daemon's own socket): for a socket that stands in
// for the daemon's, such as a relay's.
func ConnectSocket(socketPath string, session bool) (*Conn, error) {
	return connectURI(SocketURI(socketPath, session))
}

// Session reports whether the daemon is a session daemon (it runs as a user other than root).
func (c *Conn) Session() bool { return strings.HasPrefix(c.uri, "qemu+unix:///session") }

func connectURI(uri string) (*Conn, error) {
	// The event loop must exist before the connection, so that the connection uses it
	// for keepalives and events.
	if err := ensureEventLoop(); err != nil {
		return nil, err
	}
	virt, err := libvirt.NewConnect(uri)
	if err != nil {
		return nil, fmt.Errorf("connecting to libvirt at %s: %w", uri, err)
	}
	c := &Conn{virt: virt, uri: uri, closing: make(chan struct{})}
	if err := virt.RegisterCloseCallback(func(_ *libvirt.Connect, reason libvirt.ConnectCloseReason) {
		slog.Warn("libvirt connection closed by the daemon side", "uri", uri, "reason", reason)
		c.lostMu.Lock()
		c.isLost = true
		c.lostMu.Unlock()
		c.closeOnce.Do(func() { close(c.closing) })
	}); err != nil {
		_, _ = virt.Close()
		return nil, fmt.Errorf("watching the libvirt connection to %s: %w", uri, err)
	}
	return c, nil
}

// Close ends the connection's event streams and closes it.
func (c *Conn) Close() error {
	c.closeOnce.Do(func() { close(c.closing) })
	c.streams.Wait()
	_ = c.virt.UnregisterCloseCallback()
	if _, err := c.virt.Close(); err != nil {
		return fmt.Errorf("closing the libvirt connection to %s: %w", c.uri, err)
	}
	return nil
}

// LoadQEMUCapabilities has the daemon probe its QEMU binary, or read the probe from its
// capabilities cache, now. libvirt does it lazily, on the first domain it starts or receives,
// and a probe costs seconds (under TCG about 4 s): a migration target that has not loaded them
// would pay that inside the migration, against the source's deadline.
func (c *Conn) LoadQEMUCapabilities() error {
	// Empty emulator, architecture, machine and virtualization type: the host's defaults.
	if _, err := c.virt.GetDomainCapabilities("", "", "", "", 0); err != nil {
		return fmt.Errorf("loading the QEMU capabilities of %s: %w", c.uri, err)
	}
	return nil
}

func (c *Conn) lost() bool {
	c.lostMu.Lock()
	defer c.lostMu.Unlock()
	return c.isLost
}

// DefineAndStart defines a persistent domain from its XML and starts it.
func (c *Conn) DefineAndStart(domainXML string) error {
	dom, err := c.virt.DomainDefineXML(domainXML)
	if err != nil {
		return fmt.Errorf("defining a domain on %s: %w", c.uri, err)
	}
	defer dom.Free()
	if err := dom.Create(); err != nil {
		name, _ := dom.GetName()
		return fmt.Errorf("starting domain %q: %w", name, err)
	}
	return nil
}

// Info is what Lookup tells about a domain.
type Info struct {
	Name   string
	UUID   string
	State  State
	Reason Reason
}

// Lookup describes the named domain; its error wraps ErrNotFound if there is none.
func (c *Conn) Lookup(name string) (Info, error) {
	dom, err := c.lookup(name)
	if err != nil {
		return Info{}, err
	}
	defer dom.Free()
	uuid, err := dom.GetUUIDString()
	if err != nil {
		return Info{}, fmt.Errorf("reading the UUID of domain %q: %w", name, err)
	}
	state, reason, err := domainState(dom, name)
	if err != nil {
		return Info{}, err
	}
	return Info{Name: name, UUID: uuid, State: state, Reason: reason}, nil
}

// MemorySize is the named domain's memory in bytes, as libvirt defined it (the VMI's, rounded
// up as libvirt aligns it).
func (c *Conn) MemorySize(name string) (uint64, error) {
	dom, err := c.lookup(name)
	if err != nil {
		return 0, err
	}
	defer dom.Free()
	kib, err := dom.GetMaxMemory()
	if err != nil {
		return 0, fmt.Errorf("reading the memory size of domain %q: %w", name, err)
	}
	return kib << 10, nil
}

// DomainNames lists the names of the domains this libvirt daemon knows, running or not (a
// launcher's has one).
func (c *Conn) DomainNames() ([]string, error) {
	doms, err := c.virt.ListAllDomains(0)
	if err != nil {
		return nil, fmt.Errorf("listing the domains on %s: %w", c.uri, err)
	}
	var names []string
	for i := range doms {
		name, err := doms[i].GetName()
		_ = doms[i].Free()
		if err != nil {
			return nil, fmt.Errorf("reading a domain's name on %s: %w", c.uri, err)
		}
		names = append(names, name)
	}
	return names, nil
}

// State returns the named domain's state and its reason.
func (c *Conn) State(name string) (State, Reason, error) {
	dom, err := c.lookup(name)
	if err != nil {
		return NoState, ReasonUnknown, err
	}
	defer dom.Free()
	return domainState(dom, name)
}

func domainState(dom *libvirt.Domain, name string) (State, Reason, error) {
	state, reason, err := dom.GetState()
	if err != nil {
		return NoState, ReasonUnknown, fmt.Errorf("reading the state of domain %q: %w", name, err)
	}
	s, r := stateFromLibvirt(state, reason)
	return s, r, nil
}

// Shutdown presses the guest's ACPI power button, as a graceful shutdown request.
// The guest decides whether and when to power off.
func (c *Conn) Shutdown(name string) error {
	dom, err := c.lookup(name)
	if err != nil {
		return err
	}
	defer dom.Free()
	if err := dom.ShutdownFlags(libvirt.DOMAIN_SHUTDOWN_ACPI_POWER_BTN); err != nil {
		return fmt.Errorf("pressing the ACPI power button of domain %q: %w", name, err)
	}
	return nil
}

// Destroy stops the named domain at once, as pulling its power cord would.
func (c *Conn) Destroy(name string) error {
	dom, err := c.lookup(name)
	if err != nil {
		return err
	}
	defer dom.Free()
	if err := dom.Destroy(); err != nil {
		return fmt.Errorf("destroying domain %q: %w", name, err)
	}
	return nil
}

// lookup finds the named domain; the caller frees it.
func (c *Conn) lookup(name string) (*libvirt.Domain, error) {
	dom, err := c.virt.LookupDomainByName(name)
	if err != nil {
		var verr libvirt.Error
		if errors.As(err, &verr) && verr.Code == libvirt.ERR_NO_DOMAIN {
			return nil, fmt.Errorf("domain %q on %s: %w", name, c.uri, ErrNotFound)
		}
		return nil, fmt.Errorf("looking up domain %q on %s: %w", name, c.uri, err)
	}
	return dom, nil
}
