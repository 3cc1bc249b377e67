// Package migrationpair runs two nodes' sides of a live migration on one machine, for tests
// and benchmarks of migration against real libvirt: a private libvirtd per node, as a
// launcher runs it, with the agents' migration proxies between them.
package migrationpair

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"golang.org/x/time/rate"

	"github.com/lifeboat-vm/lifeboat/agent"
	"github.com/lifeboat-vm/lifeboat/agent/migrationproxy"
	"github.com/lifeboat-vm/lifeboat/api/launcher"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/api/migrationtls"
	"github.com/lifeboat-vm/lifeboat/domain"
	"github.com/lifeboat-vm/lifeboat/launcher/vmdisks"
	"github.com/lifeboat-vm/lifeboat/test/guest"
	"github.com/lifeboat-vm/lifeboat/test/guest/protocol"
	"github.com/lifeboat-vm/lifeboat/test/images"
	"github.com/lifeboat-vm/lifeboat/test/nodecert"
)

// Emulated node addresses: the source agent dials from the first, the target agent listens on the second.
var (
	SourceNodeIP = net.IPv4(127, 0, 0, 11)
	TargetNodeIP = net.IPv4(127, 0, 0, 12)
)

// Node is one node's side of a migration: a private libvirtd, as a launcher runs it, and
// that launcher's VMI directory as the node's agent sees it.
type Node struct {
	Daemon *domain.Libvirtd
	Conn   *domain.Conn
	// Dir is this node's VMI directory. The daemon and its QEMU see it at the VMI
	// directory path shared by both nodes, as a launcher pod sees its run volume.
	Dir string
}

// Launcher is the user the daemons and their QEMU run as: the launcher's, as in its pod.
var Launcher = domain.User{UID: launcher.UID, GID: launcher.GID}

// startNode starts a daemon as a launcher runs it in its unprivileged pod, a session daemon of
// the launcher's user, whose mount namespace has the node's own directory bind-mounted over
// vmiDir. Two such daemons in one process then see different directories under the same path,
// as the same path on two nodes is two directories: the migration URIs, the console log and
// the sockets QEMU creates name the same path on both sides, and nothing is rewritten for the
// test. Where the machine has /dev/userfaultfd, the namespace has a node of it that the
// launcher's user may open, as the device plugin gives a launcher pod one, for post-copy.
func startNode(t testing.TB, vmiDir string) Node {
	t.Helper()
	root := sharedDir(t, "pairnode")
	dir := filepath.Join(root, "vmi")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	mounts := append(launcherAccounts(t, root), domain.BindMount{Source: dir, Target: vmiDir})
	if uffd, ok := launcherDevice(t, root, "/dev/userfaultfd"); ok {
		mounts = append(mounts, domain.BindMount{Source: uffd, Target: "/dev/userfaultfd"})
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	d, err := domain.StartLibvirtd(ctx, domain.Config{Dir: filepath.Join(root, "daemon"), SocketDir: dir, Mounts: mounts, User: &Launcher})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.Stop(); err != nil {
			t.Errorf("stopping libvirtd: %v", err)
		}
	})
	c, err := domain.Connect(d.Socket())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	// As a launcher does at its start, so that the target does not probe QEMU mid-migration.
	if err := c.LoadQEMUCapabilities(); err != nil {
		t.Fatal(err)
	}
	return Node{Daemon: d, Conn: c, Dir: dir}
}

// launcherDevice makes, in dir, a node of the character device path that only the launcher's
// user may open, as a runtime gives a container a device plugin's device; false if the machine
// has no such device.
func launcherDevice(t testing.TB, dir, path string) (string, bool) {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR {
		return "", false
	}
	node := filepath.Join(dir, filepath.Base(path))
	if err := unix.Mknod(node, unix.S_IFCHR|0o600, int(st.Rdev)); err != nil {
		t.Fatalf("making the launcher's %s: %v", path, err)
	}
	if err := os.Chown(node, Launcher.UID, Launcher.GID); err != nil {
		t.Fatal(err)
	}
	return node, true
}

// launcherAccounts are the machine's /etc/passwd and /etc/group with the launcher's user and
// group added, as the launcher image has them (libvirt looks its user up), to mount over them.
func launcherAccounts(t testing.TB, dir string) []domain.BindMount {
	t.Helper()
	var mounts []domain.BindMount
	for file, line := range map[string]string{
		"/etc/passwd": fmt.Sprintf("lifeboat-launcher:x:%d:%d::/nonexistent:/usr/sbin/nologin\n", Launcher.UID, Launcher.GID),
		"/etc/group":  fmt.Sprintf("lifeboat-launcher:x:%d:\n", Launcher.GID),
	} {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		copied := filepath.Join(dir, filepath.Base(file))
		if err := os.WriteFile(copied, append(b, line...), 0o644); err != nil {
			t.Fatal(err)
		}
		mounts = append(mounts, domain.BindMount{Source: copied, Target: file})
	}
	return mounts
}

// sharedDir is a new directory that the launcher's user can reach (t.TempDir's parent is
// root's alone), removed when t ends.
func sharedDir(t testing.TB, pattern string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", pattern)
	if err == nil {
		err = os.Chmod(dir, 0o755)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// Console is the guest's serial console log on this node.
func (n Node) Console() string { return filepath.Join(n.Dir, "console.log") }

// Pair is a source and a target node with the migration proxies between them, as the two
// agents set them up: on the source node unix sockets in the VMI directory, forwarded over
// TCP to the target node, forwarded there to the target launcher's libvirt socket and to the
// socket its QEMU listens on for the stream. Programs using it call
// domain.MaybeRunLibvirtdShim first thing (in TestMain).
type Pair struct {
	VMIDir   string
	Src, Dst Node
	links    *links
	// images holds the containerDisk images both nodes share, as both pull the same image:
	// <volume>/disk/data.raw.
	images string
	// copyDisks is set once RunGuest gave the guest a disk whose overlay a migration copies.
	copyDisks *bool
	transport Transport
}

// links are the connections the source node's proxies dialed to the target's.
type links struct {
	mu    sync.Mutex
	conns []net.Conn
	// limit, when set, is the rate at which the source node sends on all of them together.
	limit atomic.Pointer[rate.Limiter]
	// held closes to let the libvirt link's replies through again; while it is open, the
	// source node reads nothing from that link (HoldLibvirtReplies).
	held atomic.Pointer[chan struct{}]
}

func (l *links) add(c net.Conn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.conns = append(l.conns, c)
}

// throttled is a link whose writes wait for the pair's throttle, if one is set, and, on the
// libvirt route, whose reads wait while the pair holds them.
type throttled struct {
	net.Conn
	links   *links
	libvirt bool
}

func (c throttled) Read(b []byte) (int, error) {
	if held := c.links.held.Load(); c.libvirt && held != nil {
		<-*held
	}
	return c.Conn.Read(b)
}

func (c throttled) Write(b []byte) (int, error) {
	written := 0
	for len(b) > 0 {
		n := len(b)
		if limit := c.links.limit.Load(); limit != nil {
			n = min(n, limit.Burst())
			if err := limit.WaitN(context.Background(), n); err != nil {
				return written, err
			}
		}
		m, err := c.Conn.Write(b[:n])
		written += m
		if err != nil {
			return written, err
		}
		b = b[n:]
	}
	return written, nil
}

// CloseWrite passes the proxies' half-close on to the TLS or TCP connection underneath.
func (c throttled) CloseWrite() error {
	if hc, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return hc.CloseWrite()
	}
	return c.Conn.Close()
}

// Throttle makes the source node send to the target at most bytesPerSecond over all the
// pair's links, as a slow network would (0: no limit). Unlike libvirt's bandwidth caps it also
// holds back the pages a post-copy destination asks for, which QEMU sends whatever its cap.
// Only a TLS pair's links can be throttled.
func (p Pair) Throttle(bytesPerSecond int) {
	if p.transport == PlainTCP {
		panic("migrationpair: Throttle needs a TLS pair; a plain TCP pair's links are left as they are for the kernel to splice")
	}
	if bytesPerSecond == 0 {
		p.links.limit.Store(nil)
		return
	}
	p.links.limit.Store(rate.NewLimiter(rate.Limit(bytesPerSecond), 64<<10))
}

// BreakConnections closes every connection between the nodes' proxies, as a network failure
// or an agent's restart would; the proxies go on accepting new ones. It returns how many it closed.
func (p Pair) BreakConnections() int {
	p.links.mu.Lock()
	defer p.links.mu.Unlock()
	n := len(p.links.conns)
	for _, c := range p.links.conns {
		_ = c.Close()
	}
	p.links.conns = nil
	if held := p.links.held.Swap(nil); held != nil {
		close(*held)
	}
	return n
}

// HoldLibvirtReplies stops the source node from reading what the target's libvirt sends back
// until the returned function is called or the connections are broken (BreakConnections): as a
// network that fails one way, or an agent killed as its peer answers. The source daemon's calls
// to the target's wait; the target's daemon has already acted on them.
func (p Pair) HoldLibvirtReplies() (release func()) {
	held := make(chan struct{})
	p.links.held.Store(&held)
	return func() {
		if p.links.held.CompareAndSwap(&held, nil) {
			close(held)
		}
	}
}

// New starts a pair whose proxies speak TLS between the nodes, as agents do, stopped when t ends.
func New(t testing.TB) Pair { return NewWith(t, TLS) }

// Transport is how the pair's proxies carry the streams between the nodes.
type Transport string

const (
	// TLS is what agents do: TLS 1.3 with both nodes' certificates checked (api/migrationtls).
	TLS Transport = "tls1.3"
	// PlainTCP is the baseline benchmarks measure TLS against.
	PlainTCP Transport = "tcp"
)

// NewWith starts a pair whose proxies use transport, stopped when t ends.
func NewWith(t testing.TB, transport Transport) Pair {
	t.Helper()
	// Short: unix socket paths must fit in 108 bytes.
	vmiDir := sharedDir(t, "vmi")
	p := Pair{VMIDir: vmiDir, Src: startNode(t, vmiDir), Dst: startNode(t, vmiDir), links: &links{}, images: sharedDir(t, "images"), copyDisks: new(bool), transport: transport}
	p.startProxies(t, transport)
	return p
}

func (p Pair) startProxies(t testing.TB, transport Transport) {
	t.Helper()
	ctx := t.Context()
	routes := []struct{ name, target string }{
		{domain.MigrationLibvirtSocket, p.Dst.Daemon.Socket()},
		{domain.MigrationQEMUSocket, filepath.Join(p.Dst.Dir, domain.MigrationQEMUSocket)},
		{domain.MigrationNBDSocket, filepath.Join(p.Dst.Dir, domain.MigrationNBDSocket)},
	}
	const migrationUID = "pair"
	ca := nodecert.NewCA(t)
	// The target node's side accepts only the source node, and the source only the target.
	server, err := migrationtls.ServerConfig(nodecert.Issue(t, ca, "target"), migrationUID, "source")
	if err != nil {
		t.Fatal(err)
	}
	client, err := migrationtls.ClientConfig(nodecert.Issue(t, ca, "source"), migrationUID, "target")
	if err != nil {
		t.Fatal(err)
	}
	dialer := &net.Dialer{LocalAddr: &net.TCPAddr{IP: SourceNodeIP}}
	for _, r := range routes {
		addr := net.JoinHostPort(TargetNodeIP.String(), "0")
		var target *migrationproxy.Proxy
		var err error
		if transport == PlainTCP {
			target, err = migrationproxy.ListenTCP(ctx, addr, r.target)
		} else {
			target, err = migrationproxy.ListenTLS(ctx, addr, r.target, server, nil)
		}
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = target.Close() })
		dial := func(ctx context.Context) (net.Conn, error) {
			return dialer.DialContext(ctx, "tcp", target.Addr().String())
		}
		if transport != PlainTCP {
			dial = func(ctx context.Context) (net.Conn, error) {
				return (&tls.Dialer{NetDialer: dialer, Config: client}).DialContext(ctx, "tcp", target.Addr().String())
			}
		}
		tracked := func(ctx context.Context) (net.Conn, error) {
			c, err := dial(ctx)
			if err != nil {
				return nil, err
			}
			p.links.add(c)
			if transport == PlainTCP {
				// Unwrapped, so that the kernel splices the TLS benchmark's baseline.
				return c, nil
			}
			return throttled{Conn: c, links: p.links, libvirt: r.name == domain.MigrationLibvirtSocket}, nil
		}
		source, err := migrationproxy.ListenUnix(ctx, filepath.Join(p.Src.Dir, r.name), tracked)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = source.Close() })
	}
}

// Options are the MigrateOptions of a migration through the proxies, with the given cap; the
// guest's containerDisk overlays are copied through the proxies too, as agents do.
func (p Pair) Options(bandwidth uint64) domain.MigrateOptions {
	dest, mig := domain.ProxiedURIs(p.VMIDir, p.Src.Conn.Session())
	opts := domain.MigrateOptions{DestURI: dest, MigrateURI: mig, Bandwidth: bandwidth}
	if *p.copyDisks {
		opts.DisksURI = domain.ProxiedDisksURI(p.VMIDir)
	}
	return opts
}

// WithContainerDisk gives vmi a writable containerDisk volume named volume whose image is a raw
// disk of size bytes (sparse, the test disk's label at its start), which both nodes see, as
// both would pull the same image.
func (p Pair) WithContainerDisk(t testing.TB, vmi *v1alpha1.VirtualMachineInstance, volume string, size int64) {
	t.Helper()
	dir := filepath.Join(p.images, volume, "disk")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(dir, "data.raw"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(images.GuestDiskLabel); err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	vmi.Spec.Disks = append(vmi.Spec.Disks, v1alpha1.Disk{Name: volume})
	vmi.Spec.Volumes = append(vmi.Spec.Volumes, v1alpha1.Volume{Name: volume, ContainerDisk: &v1alpha1.ContainerDiskSource{Image: "pair/" + volume}})
}

// prepareDisks makes vmi's disks ready on node n as its launcher does (vmdisks), and returns
// them at the paths its daemon sees: a target's overlay is empty, for the migration to fill.
func (p Pair) prepareDisks(t testing.TB, ctx context.Context, vmi *v1alpha1.VirtualMachineInstance, n Node) []domain.Disk {
	t.Helper()
	prepared, err := vmdisks.Prepare(ctx, vmi.Spec, nil, vmdisks.Identity{UID: string(vmi.UID), Name: vmi.Name},
		vmdisks.Dirs{ContainerDisks: p.images, State: n.Dir})
	if err != nil {
		t.Fatal(err)
	}
	// The overlays are the launcher's to write, as in its pod's volume.
	if err := Launcher.Own(n.Dir); err != nil {
		t.Fatal(err)
	}
	for i := range prepared.Disks {
		rel, err := filepath.Rel(n.Dir, prepared.Disks[i].Path)
		if err != nil {
			t.Fatal(err)
		}
		prepared.Disks[i].Path = filepath.Join(p.VMIDir, rel)
	}
	return prepared.Disks
}

// RunGuest starts vmi on the source node with its console in the VMI directory, and waits
// until it counts; it returns the domain's name. Its disks are prepared on both nodes first.
func (p Pair) RunGuest(t testing.TB, ctx context.Context, vmi *v1alpha1.VirtualMachineInstance, acceleration domain.Acceleration) string {
	t.Helper()
	vmi = p.launcherBoot(t, vmi)
	disks := p.prepareDisks(t, ctx, vmi, p.Src)
	p.prepareDisks(t, ctx, vmi, p.Dst)
	*p.copyDisks = agent.CopiesDisks(vmi)
	xml, err := domain.DomainXML(vmi, domain.XMLOptions{Acceleration: acceleration, ConsoleLog: filepath.Join(p.VMIDir, "console.log"), Disks: disks})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Src.Conn.DefineAndStart(xml); err != nil {
		t.Fatal(err)
	}
	if _, err := guest.WaitForConsole(ctx, p.Src.Console(), "the counter at 2", func(out string) bool {
		n, ok := protocol.LastCounter(out)
		return ok && n >= 2
	}); err != nil {
		t.Fatal(err)
	}
	return domain.DomainName(vmi.Namespace, vmi.Name)
}

// launcherBoot is vmi with its boot files copied where the launcher's user can read them, as a
// launcher pod has them from an image: the test guest's are in root's cache.
func (p Pair) launcherBoot(t testing.TB, vmi *v1alpha1.VirtualMachineInstance) *v1alpha1.VirtualMachineInstance {
	t.Helper()
	vmi = vmi.DeepCopy()
	dir := filepath.Join(p.images, "boot")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []*string{&vmi.Spec.Boot.Kernel, &vmi.Spec.Boot.Initrd} {
		if *f == "" {
			continue
		}
		b, err := os.ReadFile(*f)
		if err != nil {
			t.Fatal(err)
		}
		copied := filepath.Join(dir, filepath.Base(*f))
		if err := os.WriteFile(copied, b, 0o644); err != nil {
			t.Fatal(err)
		}
		*f = copied
	}
	return vmi
}

// HandOffs plays the source launcher's part in migrations of the named guest made with
// domain.MigrateOptions.PausedOnArrival, as the launcher does (domain.Handoffs), until ctx ends:
// the returned channel has the outcome of each hand-off, in order.
func (p Pair) HandOffs(t testing.TB, ctx context.Context, name string) <-chan HandoffOutcome {
	t.Helper()
	events, err := p.Src.Conn.Events(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The source node's proxy socket, where this process sees it.
	destURI, _ := domain.ProxiedURIs(p.Src.Dir, p.Src.Conn.Session())
	outcomes := make(chan HandoffOutcome, 16)
	h := domain.NewHandoffs(ctx, name, destURI, func() (int, error) { return p.Src.Daemon.QEMUPid(name) },
		func(r domain.HandoffResult, err error) { outcomes <- HandoffOutcome{Result: r, Err: err} })
	go func() {
		for ev := range events {
			h.Observe(p.Src.Conn, ev)
		}
	}()
	return outcomes
}

// HandoffOutcome is how one hand-off ended.
type HandoffOutcome struct {
	Result domain.HandoffResult
	Err    error
}
