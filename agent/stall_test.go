package agent

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"

	lifeboatfake "github.com/lifeboat-vm/lifeboat/api/client/clientset/versioned/fake"
	lifeboatinformers "github.com/lifeboat-vm/lifeboat/api/client/informers/externalversions"
	lifeboatv1alpha1informers "github.com/lifeboat-vm/lifeboat/api/client/informers/externalversions/lifeboat/v1alpha1"
	contract "github.com/lifeboat-vm/lifeboat/api/launcher"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/api/notify"
	"github.com/lifeboat-vm/lifeboat/domain"
)

// keepaliveProgram is libvirt's keepalive RPC program ("keep"), which a hostile daemon answers
// while it withholds every other reply: the connection then never times out by itself.
const keepaliveProgram = 0x6b656570

// stallingDaemon stands in for a launcher's libvirtd on the launcher's socket: it relays libvirt's
// RPC frames to a real daemon until stalled, and from then on passes only keepalives, as a daemon a
// tenant replaced may. Each call or reply it withholds is told on withheld.
type stallingDaemon struct {
	ln       net.Listener
	daemon   string
	stalled  atomic.Bool
	withheld chan string
}

func newStallingDaemon(t *testing.T, path, daemon string) *stallingDaemon {
	t.Helper()
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	// A launcher's socket is its user's: the agent asks a session daemon's driver then.
	if err := os.Chown(path, contract.UID, contract.UID); err != nil {
		t.Fatal(err)
	}
	s := &stallingDaemon{ln: ln, daemon: daemon, withheld: make(chan string, 100)}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("unix", daemon)
			if err != nil {
				c.Close()
				continue
			}
			go s.forward(c, up, true)
			go s.forward(up, c, false)
		}
	}()
	return s
}

// forward copies frames from src to dst, withholding all but keepalives once stalled.
func (s *stallingDaemon) forward(src, dst net.Conn, fromClient bool) {
	defer src.Close()
	defer dst.Close()
	r := bufio.NewReader(src)
	for {
		var head [8]byte // length (itself included), program
		if _, err := io.ReadFull(r, head[:]); err != nil {
			return
		}
		n := binary.BigEndian.Uint32(head[:4])
		if n < 8 || n > 1<<24 {
			return
		}
		frame := make([]byte, n)
		copy(frame, head[:])
		if _, err := io.ReadFull(r, frame[8:]); err != nil {
			return
		}
		if s.stalled.Load() && binary.BigEndian.Uint32(head[4:]) != keepaliveProgram {
			// A reply withheld stalls a call made just before the stall (a sync the connection
			// started), which holds a worker as well as one made after it.
			what := "reply"
			if fromClient {
				what = "call"
			}
			select {
			case s.withheld <- what:
			default:
			}
			continue
		}
		if _, err := dst.Write(frame); err != nil {
			return
		}
	}
}

// healthyLauncher is a launcher whose libvirt answers at once: its guest runs.
type healthyLauncher struct{ changes chan struct{} }

func (h *healthyLauncher) Observe(context.Context, string) (*Domain, error) {
	return &Domain{State: DomainRunning}, nil
}
func (h *healthyLauncher) Changes() <-chan struct{}               { return h.changes }
func (h *healthyLauncher) Shutdown(context.Context, string) error { return nil }
func (h *healthyLauncher) Destroy(context.Context, string) error  { return nil }
func (h *healthyLauncher) Close() error                           { return nil }
func (h *healthyLauncher) DomainNames(context.Context) ([]string, error) {
	return []string{"ns_vm"}, nil
}

// Launchers whose libvirt takes calls and never answers them (issue 45, N5) hold each one of the
// agent's workers until the call's deadline and no more. With one stalled call outstanding, the
// node's other VMs are marked for evacuation at once; with a stalled call on every worker (two
// stalled launchers, two workers: the attack in N5), the next VM's mark waits for the first
// deadline, not for ever, and lands well inside its pod's grace period. A second call to a stalled
// launcher fails within its turn instead of taking another worker. At the deadline each stalled
// call is abandoned, counted and recorded on its VMI, and the cut connection ends libvirt's own
// call too.
//
// The stalled launchers are real down to the socket: the agent's libvirt client connects through
// its relay to a socket in the launcher's directory, where a daemon relays to a real libvirtd
// until it stalls; from then on it passes keepalives only, so libvirt's client would wait for
// ever.
func TestAStalledLauncherHoldsOneWorkerAndTheOthersAreEvacuatedOnTime(t *testing.T) {
	needRoot(t)
	// Short paths: a unix socket's path holds 107 bytes.
	root, err := os.MkdirTemp("", "stall")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	if err := os.Chmod(root, 0o755); err != nil { // the daemon's user reaches its directory
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	daemon, err := domain.StartLibvirtd(ctx, domain.Config{Dir: filepath.Join(root, "daemon"), User: &domain.User{UID: contract.UID, GID: contract.UID}})
	if err != nil {
		t.Fatalf("starting the launchers' libvirtd: %v", err)
	}
	t.Cleanup(func() { _ = daemon.Stop() })

	stalledUIDs, healthyUIDs := []string{"stalled-1", "stalled-2"}, []string{"healthy-1", "healthy-2"}
	domains := filepath.Join(root, "domains")
	stalling := map[string]*stallingDaemon{}
	for _, uid := range append(slices.Clone(stalledUIDs), healthyUIDs...) {
		if err := os.MkdirAll(filepath.Join(domains, uid), 0o755); err != nil {
			t.Fatal(err)
		}
		socket := filepath.Join(domains, uid, contract.LibvirtSocket)
		if slices.Contains(stalledUIDs, uid) {
			stalling[uid] = newStallingDaemon(t, socket, daemon.Socket())
			continue
		}
		l, err := net.Listen("unix", socket)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
	}

	realDial := LibvirtDialer(filepath.Join(root, "relays"), slog.Default())
	dial := func(ctx context.Context, path, uid string) (DomainConn, error) {
		if slices.Contains(healthyUIDs, uid) {
			return &healthyLauncher{changes: make(chan struct{})}, nil
		}
		return realDial(ctx, path, uid)
	}
	config := gateOn(nil)
	config.Name = v1alpha1.ConfigName
	objects := []runtime.Object{config}
	for _, uid := range append(slices.Clone(stalledUIDs), healthyUIDs...) {
		v := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: uid, UID: types.UID(uid)}}
		v.Spec.EvictionStrategy = ptr.To(v1alpha1.EvictionStrategyLiveMigrate)
		v.Status.Phase, v.Status.NodeName = v1alpha1.VMIRunning, "node"
		objects = append(objects, v)
	}
	client := lifeboatfake.NewSimpleClientset(objects...)
	informers := lifeboatinformers.NewSharedInformerFactory(client, 0)
	metrics := NewMetrics(prometheus.NewRegistry())
	recorder := record.NewFakeRecorder(100)
	a, err := New(Config{NodeName: "node", DomainsDir: domains, Dial: dial, Metrics: metrics, Recorder: recorder,
		Log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})), Configs: informers.Lifeboat().V1alpha1().LifeboatConfigs().Lister()},
		client, informers.Lifeboat().V1alpha1().VirtualMachineInstances(), informers.Lifeboat().V1alpha1().LifeboatConfigs(),
		[]lifeboatv1alpha1informers.VirtualMachineInstanceMigrationInformer{informers.Lifeboat().V1alpha1().VirtualMachineInstanceMigrations()})
	if err != nil {
		t.Fatal(err)
	}
	informers.Start(ctx.Done())
	errc := make(chan error, 1)
	const workers = 2
	go func() { errc <- a.Run(ctx, workers) }()
	waitFor := func(what string, within time.Duration, cond func() bool) {
		t.Helper()
		var ended error
		stopped := false
		err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, within, true, func(context.Context) (bool, error) {
			select {
			case ended = <-errc:
				stopped = true
				return false, errAgentEnded
			default:
			}
			return cond(), nil
		})
		if stopped {
			t.Fatalf("the agent ended while waiting for %s: %v", what, ended)
		}
		if err != nil {
			t.Fatalf("%s: not within %s", what, within)
		}
	}
	waitFor("every launcher connected", time.Minute, func() bool {
		for _, uid := range append(slices.Clone(stalledUIDs), healthyUIDs...) {
			if !a.connected(uid) {
				return false
			}
		}
		return true
	})
	guards := map[string]*guardedConn{}
	for _, uid := range stalledUIDs {
		g, ok := a.conn(uid).(*guardedConn)
		if !ok {
			t.Fatalf("launcher %s's connection is a %T, not guarded", uid, a.conn(uid))
		}
		guards[uid] = g
	}
	abandoned := func() float64 { return testutil.ToFloat64(metrics.LibvirtCallsAbandoned.WithLabelValues("observe")) }
	// stall has a stalled launcher's daemon stop answering and the agent look at its VMI, which
	// takes a worker until the call is abandoned.
	stall := func(uid string) time.Time {
		t.Helper()
		stalling[uid].stalled.Store(true)
		at := time.Now()
		a.queue.Add(uid)
		select {
		case <-stalling[uid].withheld:
		case <-time.After(10 * time.Second):
			t.Fatalf("the agent made no call to the stalled launcher %s", uid)
		}
		return at
	}
	// evacuate sends a healthy launcher's SIGTERM (30 s of pod grace) and returns how long the
	// agent took to mark its VMI for evacuation.
	evacuate := func(uid string, within time.Duration) time.Duration {
		t.Helper()
		signalled := time.Now()
		a.HandleNotify(&notify.Message{Kind: notify.KindGracefulShutdown, VMI: notify.VMIRef{Namespace: "ns", Name: uid, UID: uid},
			Time: signalled, PodGracePeriodSeconds: 30}, 0)
		waitFor(uid+" marked for evacuation", within, func() bool {
			v, err := client.LifeboatV1alpha1().VirtualMachineInstances("ns").Get(ctx, uid, metav1.GetOptions{})
			return err == nil && v.Status.EvacuationDeadline != nil
		})
		return time.Since(signalled)
	}

	// One stalled call outstanding: the other worker marks the next VM at once.
	firstStall := stall(stalledUIDs[0])
	latency := evacuate(healthyUIDs[0], libvirtCallDeadline/2)
	if n := abandoned(); n != 0 || time.Since(firstStall) >= libvirtCallDeadline {
		t.Fatalf("%s was marked %s after its signal, but not while the stalled call was outstanding (abandoned %v, %s after the stall)",
			healthyUIDs[0], latency, n, time.Since(firstStall))
	}
	t.Logf("%s was marked %s after its SIGTERM, with a stalled call outstanding for %s", healthyUIDs[0], latency, time.Since(firstStall))

	// A second call to the stalled launcher (the migration worker's, say) does not wait for the
	// deadline: it fails once its turn does not come.
	busy := make(chan error, 1)
	start := time.Now()
	go func() {
		_, err := a.migrator(stalledUIDs[0]).JobStats(domain.DomainName("ns", stalledUIDs[0]))
		busy <- err
	}()
	select {
	case err := <-busy:
		if !errors.Is(err, errLauncherBusy) {
			t.Fatalf("a second call to the stalled launcher: %v; want %v", err, errLauncherBusy)
		}
		t.Logf("a second call to the stalled launcher failed after %s: %v", time.Since(start), err)
	case <-time.After(launcherTurnWait + 2*time.Second):
		t.Fatalf("a second call to the stalled launcher still waits after %s: it takes a worker of its own", time.Since(start))
	}

	// A stalled call on every worker: the next VM's mark waits for the first deadline, no longer,
	// and lands well within its 30 s of grace.
	stall(stalledUIDs[1])
	latency = evacuate(healthyUIDs[1], libvirtCallDeadline+5*time.Second)
	if since := time.Since(firstStall); since < libvirtCallDeadline-time.Second {
		t.Errorf("%s was marked %s after the first stall, before any call's deadline (%s): were both workers held?", healthyUIDs[1], since, libvirtCallDeadline)
	}
	t.Logf("with every worker held by a stalled launcher, %s was marked %s after its SIGTERM", healthyUIDs[1], latency)

	// At their deadlines both stalled calls are abandoned, counted and recorded on their VMIs; their
	// connections are cut, which ends libvirt's own calls, and the launchers are no longer connected.
	waitFor("both stalled calls abandoned", libvirtCallDeadline+5*time.Second, func() bool { return abandoned() == 2 })
	for _, uid := range stalledUIDs {
		ended := make(chan struct{})
		go func() { guards[uid].calls.Wait(); close(ended) }()
		select {
		case <-ended:
		case <-time.After(5 * time.Second):
			t.Fatalf("libvirt's call to the stalled launcher %s did not end once its connection was cut", uid)
		}
		waitFor(uid+" disconnected", 10*time.Second, func() bool { return !a.connected(uid) })
		if _, err := guards[uid].Observe(ctx, "any"); !errors.Is(err, errLauncherStalled) {
			t.Errorf("a call on %s's abandoned connection: %v, want %v at once", uid, err, errLauncherStalled)
		}
	}
	// The Event of an abandoned call is recorded just after it is counted: wait for both.
	var events []string
	stalledEvent := "Warning " + ReasonLauncherStalled + " The launcher's libvirt on node node did not answer observe within 10s"
	noMore := time.After(5 * time.Second)
collect:
	for countEvents(events, stalledEvent) < 2 {
		select {
		case e := <-recorder.Events:
			events = append(events, e)
		case <-noMore:
			break collect
		}
	}
	if n := countEvents(events, stalledEvent); n != 2 {
		t.Errorf("%d Warning %s Events within 5 s of both calls' abandonment, want one on each stalled launcher's VMI; events: %q", n, ReasonLauncherStalled, events)
	}
	// The healthy launchers stay connected and served throughout.
	for _, uid := range healthyUIDs {
		if !a.connected(uid) {
			t.Errorf("the healthy launcher %s was disconnected", uid)
		}
	}
}

func countEvents(events []string, prefix string) int {
	n := 0
	for _, e := range events {
		if strings.HasPrefix(e, prefix) {
			n++
		}
	}
	return n
}

// A launcher's socket that takes the connection and never answers, not even libvirt's handshake,
// holds the dial no longer than its context: the relay is cut, the launcher's end of the
// connection sees it close, and nothing of the relay is left.
func TestADaemonThatNeverAnswersDoesNotHoldTheDial(t *testing.T) {
	needRoot(t)
	root, err := os.MkdirTemp("", "mute")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	socket := filepath.Join(root, contract.LibvirtSocket)
	ln, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if err := os.Chown(socket, contract.UID, contract.UID); err != nil {
		t.Fatal(err)
	}
	accepted := make(chan net.Conn, 10)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c // and never a byte back
		}
	}()
	relays := filepath.Join(root, "relays")
	const deadline = 500 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	start := time.Now()
	conn, err := LibvirtDialer(relays, slog.Default())(ctx, socket, "mute")
	took := time.Since(start)
	if err == nil {
		conn.Close()
		t.Fatal("connected to a daemon that never answers")
	}
	if !errors.Is(err, context.DeadlineExceeded) || took > deadline+2*time.Second {
		t.Fatalf("dialling a daemon that never answers: %v after %s; want the context's deadline after %s", err, took, deadline)
	}
	var c net.Conn
	select {
	case c = <-accepted:
	case <-time.After(5 * time.Second):
		t.Fatal("the relay never reached the launcher's socket")
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.Copy(io.Discard, c); err != nil {
		t.Fatalf("the launcher's end of the cut connection: %v; want it closed", err)
	}
	if entries, err := os.ReadDir(relays); err != nil || len(entries) != 0 {
		t.Errorf("the relays' directory after a cut dial: %v, %v; want it empty", entries, err)
	}
}

// needRoot fails a test that gives sockets to the launchers' user, or runs a daemon as it.
func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("a launcher's socket and libvirtd are its user's (107), which needs root: run the tests as root, as make test and .ci/run do (README, Prerequisites)")
	}
}

// errAgentEnded stops a wait of the stall test whose agent returned.
var errAgentEnded = errors.New("the agent ended")
