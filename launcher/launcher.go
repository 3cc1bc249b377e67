// Package launcher is the VM pod's main process: it runs the pod's private libvirt daemon,
// defines and starts the guest, and reports to the node agent. On SIGTERM it does not stop the
// guest itself: it records the signal in the domain's metadata (where it survives an agent
// restart), tells the agent, and keeps serving until the domain is gone or SIGKILL arrives.
package launcher

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"

	contract "github.com/lifeboat-vm/lifeboat/api/launcher"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/api/notify"
	"github.com/lifeboat-vm/lifeboat/domain"
	"github.com/lifeboat-vm/lifeboat/launcher/vmdisks"
)

// Config is the launcher's input, from its flags and its pod's environment.
type Config struct {
	VMI contract.VMI
	// MigrationTarget, if not empty, is the UID of the migration this launcher receives the guest in.
	MigrationTarget       string
	PodGracePeriodSeconds int64
	// RunDir is the pod's run volume, shared with the agent.
	RunDir string
	// NodeDirectories are the allowed node directories the pod mounts; boot files must stay in them.
	NodeDirectories []string
	// Disks are where the pod mounts the VM's images and its emptyDir.
	Disks        vmdisks.Dirs
	Acceleration domain.Acceleration
	Log          *slog.Logger
}

// ConfigFromEnv reads the VMI and the pod grace period the launcher pod passes in its environment.
func ConfigFromEnv(getenv func(string) string) (Config, error) {
	var cfg Config
	raw := getenv(contract.EnvVMI)
	if raw == "" {
		return cfg, fmt.Errorf("$%s is empty: the launcher runs only in a launcher pod", contract.EnvVMI)
	}
	if err := json.Unmarshal([]byte(raw), &cfg.VMI); err != nil {
		return cfg, fmt.Errorf("decoding $%s: %w", contract.EnvVMI, err)
	}
	if cfg.VMI.UID == "" || cfg.VMI.Name == "" || cfg.VMI.Namespace == "" {
		return cfg, fmt.Errorf("$%s lacks the VMI's namespace, name or UID", contract.EnvVMI)
	}
	cfg.MigrationTarget = getenv(contract.EnvMigrationTarget)
	if d := getenv(contract.EnvNodeDirectories); d != "" {
		if err := json.Unmarshal([]byte(d), &cfg.NodeDirectories); err != nil {
			return cfg, fmt.Errorf("decoding $%s: %w", contract.EnvNodeDirectories, err)
		}
	}
	if g := getenv(contract.EnvPodGracePeriod); g != "" {
		n, err := strconv.ParseInt(g, 10, 64)
		if err != nil || n < 0 {
			return cfg, fmt.Errorf("$%s=%q is not a grace period in seconds", contract.EnvPodGracePeriod, g)
		}
		cfg.PodGracePeriodSeconds = n
	}
	return cfg, nil
}

// Run runs the VM until its domain is gone and returns the launcher's exit code.
// SIGTERMs arrive on sigterm; ctx ends only with the process.
func Run(ctx context.Context, cfg Config, sigterm <-chan os.Signal) int {
	log := cfg.Log.With("vmi", cfg.VMI.Namespace+"/"+cfg.VMI.Name, "uid", cfg.VMI.UID)
	ref := notify.VMIRef{Namespace: cfg.VMI.Namespace, Name: cfg.VMI.Name, UID: cfg.VMI.UID}
	// Where its start's time goes begins here: the steps after it are logged too.
	log.Info("launcher started", "migrationTarget", cfg.MigrationTarget)
	dir := cfg.RunDir
	notifier := NewNotifier(filepath.Join(dir, contract.NotifySocketName), ref, log)
	notifyCtx, stopNotifier := context.WithCancel(ctx)
	notifierDone := make(chan struct{})
	go func() {
		notifier.Run(notifyCtx)
		close(notifierDone)
	}()
	defer func() {
		if !notifier.Flush(5 * time.Second) {
			log.Warn("exiting before the agent heard the last reports")
		}
		stopNotifier()
		<-notifierDone
	}()

	code, err := run(ctx, cfg, dir, log, notifier, sigterm)
	if err != nil {
		log.Error("launcher failed", "err", err)
		notifier.Report(notify.KindFailed, time.Now(), 0, err.Error())
	}
	return code
}

// run runs the VM with its files in dir, the pod's run volume.
func run(ctx context.Context, cfg Config, dir string, log *slog.Logger, notifier *Notifier, sigterm <-chan os.Signal) (int, error) {
	// A root launcher would run a system libvirtd with the node's privileges over the guest.
	if os.Geteuid() == 0 {
		return contract.ExitFailed, fmt.Errorf("the launcher runs as root; its pod must run it as an unprivileged user (uid %d)", contract.UID)
	}
	// What the launcher, its libvirtd and QEMU make (the sockets QEMU listens on in a migration
	// among them) is the launcher's user's and group's: the node's agent joins the group
	// instead of overriding permissions.
	syscall.Umask(0o007)
	// Asked at once, while the disks and the network are made ready.
	capsAnswer := fetchQEMUCapabilities(ctx, filepath.Join(dir, contract.NotifySocketName),
		notify.VMIRef{Namespace: cfg.VMI.Namespace, Name: cfg.VMI.Name, UID: cfg.VMI.UID})
	if err := CheckNodePaths(cfg.VMI.Spec.Boot, cfg.NodeDirectories); err != nil {
		return contract.ExitFailed, err
	}
	prepared, err := vmdisks.Prepare(ctx, cfg.VMI.Spec, cfg.VMI.VolumeStatus, vmdisks.Identity{UID: cfg.VMI.UID, Name: cfg.VMI.Name}, cfg.Disks)
	if err != nil {
		return contract.ExitFailed, fmt.Errorf("preparing the VM's disks: %w", err)
	}
	iface, err := podNetwork(ctx, cfg, dir, log)
	if err != nil {
		return contract.ExitFailed, err
	}
	caps := <-capsAnswer
	if caps.err != nil {
		log.Info("probing QEMU here: the agent gave no QEMU capabilities", "reason", caps.err, "waited", caps.took.Round(time.Millisecond))
	}
	daemon, err := domain.StartLibvirtd(ctx, domain.Config{Dir: filepath.Join(dir, "libvirt"), SocketDir: dir, QEMUCapabilities: caps.caps})
	if err != nil {
		return contract.ExitFailed, fmt.Errorf("starting the pod's libvirtd: %w", err)
	}
	defer func() {
		if err := daemon.Stop(); err != nil {
			log.Warn("stopping libvirtd", "err", err)
		}
	}()
	s, err := openSession(ctx, daemon, notifier, log)
	if err != nil {
		return contract.ExitFailed, err
	}
	defer s.Close()
	// Before a guest is started here or migrated in: a migration target would otherwise probe
	// QEMU in the middle of the migration.
	loadStart := time.Now()
	if err := s.Conn().LoadQEMUCapabilities(); err != nil {
		return contract.ExitFailed, err
	}
	log.Info("QEMU capabilities loaded", "took", time.Since(loadStart).Round(time.Millisecond), "fromAgent", caps.err == nil, "agentAnswered", caps.took.Round(time.Millisecond))

	name := domain.DomainName(cfg.VMI.Namespace, cfg.VMI.Name)
	if cfg.MigrationTarget != "" {
		arrived, err := awaitGuest(ctx, s, name, sigterm, log)
		if !arrived {
			return contract.ExitGuestPoweredOff, err
		}
		log.Info("the guest arrived by migration", "domain", name, "migration", cfg.MigrationTarget)
		go reportMigrationCost(ctx, s.Conn, name, notifier, log)
		if err := s.Conn().ClearGracefulShutdown(name); err != nil {
			return contract.ExitFailed, fmt.Errorf("clearing the source pod's shutdown record from the arrived guest: %w", err)
		}
	} else if err := startGuest(ctx, s.Conn(), cfg, dir, prepared, iface); err != nil {
		return contract.ExitFailed, err
	}
	if size, err := s.Conn().MemorySize(name); err != nil {
		log.Warn("the guest's memory size cannot be read; the agent bounds the guest's memory in use by QEMU's resident memory alone", "err", err)
	} else {
		notifier.AnswerGuestMemory(func() (uint64, uint64, error) {
			resident, err := s.daemon.GuestMemoryResident(name, size)
			return resident, size, err
		})
	}
	notifier.Report(notify.KindDomainStarted, time.Now(), 0, "")
	go boundConsoleLog(ctx, filepath.Join(dir, contract.ConsoleLog), log)
	return watchDomain(ctx, s, name, cfg.PodGracePeriodSeconds, iface != nil, sigterm, log)
}

// watchDomain serves the running domain until it is gone, and returns the launcher's exit code.
// A libvirtd that dies meanwhile is restarted (daemonSession.recover): the guest runs on in its
// QEMU, which the new daemon takes back. A launcher whose guest is on the pod network (podNet)
// keeps its pod after the guest left by migration until its agent's forward ends (awaitHandover).
func watchDomain(ctx context.Context, s *daemonSession, name string, podGrace int64, podNet bool, sigterm <-chan os.Signal, log *slog.Logger) (int, error) {
	// A stop event may have come before we listened for it; start from the current state.
	if code, done := exitCode(s.Conn(), name); done {
		return code, nil
	}
	events := s.Events()
	// A migration away leaves the guest paused on the target until this pod's QEMU has ended.
	destURI, _ := domain.ProxiedURIs(contract.PodRunDir, s.Conn().Session())
	handoffs := domain.NewHandoffs(ctx, name, destURI, func() (int, error) { return s.daemon.QEMUPid(name) },
		func(r domain.HandoffResult, err error) {
			switch {
			case errors.Is(err, domain.ErrForwardClosed):
				// This agent had recorded the migration before this launcher got here (a node
				// short of CPU): the usual end of a successful migration there, nothing to warn of.
				log.Info("the migration was recorded before this launcher resumed the guest at its target, whose agent runs a guest that arrived", "domain", name, "err", err)
				return
			case err != nil:
				// The target's agent runs the guest once the migration is recorded complete: the
				// guest waits longer, paused, but is not lost.
				log.Warn("could not run the guest at the migration's target; its agent runs it once the migration is recorded complete", "domain", name, "err", err)
				return
			}
			log.Info("hand-off", "domain", name, "result", r)
		})
	// recovered restarts the daemon or reconnects, and then says whether the domain ended while
	// nothing watched it: the new event stream does not tell what happened before it began.
	recovered := func() (int, bool, error) {
		if err := s.recover(ctx); err != nil {
			return contract.ExitFailed, true, err
		}
		events = s.Events()
		code, done := exitCode(s.Conn(), name)
		if done {
			log.Info("the domain ended while libvirtd was down", "domain", name, "exitCode", code)
			s.notifier.Report(notify.KindDomainGone, time.Now(), 0, "")
		}
		return code, done, nil
	}
	// Set once an event finds the domain gone: its stop event, still queued, says how it went.
	var stopDue <-chan time.Time
	// terminating is when the first SIGTERM came: the pod's grace period runs from there.
	var terminating time.Time
	for {
		select {
		case <-stopDue:
			log.Warn("the domain went without a stop event", "domain", name, "waited", confirmTimeout)
			s.notifier.Report(notify.KindDomainGone, time.Now(), 0, "")
			return contract.ExitGuestPoweredOff, nil
		case <-sigterm:
			now := time.Now()
			if terminating.IsZero() {
				terminating = now
			}
			// The agent hears first: recording the signal in the domain waits for libvirt's job
			// lock, which an outgoing migration holds (up to 30 s, then it fails).
			s.notifier.Report(notify.KindGracefulShutdown, now, podGrace, "")
			log.Info("SIGTERM: told the agent; the guest keeps running until it decides", "podGracePeriodSeconds", podGrace)
			gs := domain.GracefulShutdown{SignalTime: now, Deadline: now.Add(time.Duration(podGrace) * time.Second)}
			go recordGracefulShutdown(ctx, s.Conn, name, gs, log)
		case ev, ok := <-events:
			if !ok {
				if code, done, err := recovered(); done {
					return code, err
				}
				continue
			}
			if ev.Domain != name {
				continue
			}
			handoffs.Observe(s.Conn(), ev)
			code, reason, end := domainEnd(ev, func() (domain.State, domain.Reason, error) { return s.Conn().State(name) })
			if end == endUnknown && stopDue == nil {
				// Gone since this event was sent: a late event (a busy node) must not say how,
				// or a guest that left by migration would be reported powered off.
				stopDue = time.After(confirmTimeout)
			}
			if end == endKnown {
				if reason == domain.ReasonMigrated {
					// The source daemon still confirms the migration to its peer; it undefines the
					// domain when that is done, and must live until then.
					awaitUndefined(s.Conn(), events, name, log)
					handoffs.Wait(ctx)
				}
				s.notifier.Report(notify.KindDomainGone, time.Now(), 0, string(reason))
				log.Info("domain gone", "event", ev.Type, "reason", reason, "exitCode", code)
				if reason == domain.ReasonMigrated && podNet {
					awaitHandover(ctx, s.notifier, handoverBound(terminating, podGrace, time.Now()), sigterm, podGrace, log)
				}
				return code, nil
			}
		case <-s.daemon.Done():
			if code, done, err := recovered(); done {
				return code, err
			}
		case <-ctx.Done():
			return contract.ExitFailed, ctx.Err()
		}
	}
}

// MsgHandoverDone is logged when the agent has said the pod is no longer needed after its
// guest left by migration.
const MsgHandoverDone = "the pod is no longer needed for the guest's connections"

// awaitHandover keeps the pod after its guest left by migration, until the agent says it is no
// longer needed: the agent makes the pod forward the guest's connections to the target pod
// until Service proxies send them there, and the forward lives in the pod's network
// namespace, which goes when the launcher exits. A lost agent ends the wait, and so does bound:
// HandoverAtMost, or half the pod's grace period once it is being terminated (a kubelet that
// evicts the pod, or a drain, must see it end well before its SIGKILL; a SIGTERM during the
// wait sets that bound from then).
func awaitHandover(ctx context.Context, notifier *Notifier, bound time.Duration, sigterm <-chan os.Signal, podGrace int64, log *slog.Logger) {
	start := time.Now()
	until := start.Add(bound)
	timer := time.NewTimer(bound)
	defer timer.Stop()
	for {
		select {
		case <-notifier.HandoverDone():
			log.Info(MsgHandoverDone, "waited", time.Since(start).Round(time.Millisecond))
			return
		case <-notifier.Connection():
			log.Info("the agent's connection ended while the pod forwarded the guest's connections; exiting")
			return
		case <-timer.C:
			log.Warn("the agent did not say the pod is no longer needed; exiting", "waited", time.Since(start).Round(time.Millisecond))
			return
		case <-sigterm:
			now := time.Now()
			if end := now.Add(handoverBound(now, podGrace, now)); end.Before(until) {
				until = end
				timer.Reset(until.Sub(now))
			}
		case <-ctx.Done():
			return
		}
	}
}

// handoverBound is how long a launcher whose guest left at now still waits for its agent's word:
// notify.HandoverAtMost, or, once its pod is terminating (since terminating, zero if not), what
// is left of the first half of its grace period.
func handoverBound(terminating time.Time, podGrace int64, now time.Time) time.Duration {
	if terminating.IsZero() {
		return notify.HandoverAtMost
	}
	left := terminating.Add(time.Duration(podGrace) * time.Second / 2).Sub(now)
	return max(0, min(left, notify.HandoverAtMost))
}

// reportMigrationCost logs what the migration that brought the guest cost it, from the
// statistics libvirt keeps on the destination once it has finished the migration (a moment
// after the guest runs here), and tells the agent how long the guest stood still.
func reportMigrationCost(ctx context.Context, conn func() *domain.Conn, name string, notifier *Notifier, log *slog.Logger) {
	var stats domain.JobStats
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		var err error
		stats, err = conn().CompletedJobStats(name)
		return err == nil && stats.Type == domain.JobCompleted, nil
	})
	if err != nil {
		log.Warn("libvirt kept no statistics of the migration", "domain", name, "err", err)
		return
	}
	log.Info("migration statistics", "domain", name, "downtime", stats.Downtime, "elapsed", stats.Elapsed,
		"dataTotal", stats.DataTotal)
	notifier.ReportMigrated(time.Now(), stats.Downtime)
}

// recordGracefulShutdown writes the signal into the domain's metadata, where a restarted agent
// or libvirt finds it, trying again while libvirt's job lock is held (a migration) until it
// succeeds or the domain is gone; the agent already knows from the report. conn is asked at each
// try, so a try after a restart of the daemon uses the new connection.
func recordGracefulShutdown(ctx context.Context, conn func() *domain.Conn, name string, gs domain.GracefulShutdown, log *slog.Logger) {
	_ = wait.PollUntilContextCancel(ctx, time.Second, true, func(context.Context) (bool, error) {
		err := conn().SetGracefulShutdown(name, gs)
		if err == nil || errors.Is(err, domain.ErrNotFound) {
			return true, nil
		}
		log.Warn("recording the graceful-shutdown signal in the domain; trying again", "err", err)
		return false, nil
	})
}

// podNetwork has the agent build the guest's side of the pod network, when the VMI has an
// interface there, and serves the guest DHCP on it. A migration target does the same: the
// domain that arrives names the tap, and its guest renews its lease here.
func podNetwork(ctx context.Context, cfg Config, dir string, log *slog.Logger) (*domain.Interface, error) {
	spec, ok, err := v1alpha1.PodInterface(&cfg.VMI.Spec)
	if err != nil || !ok {
		return nil, err
	}
	ref := notify.VMIRef{Namespace: cfg.VMI.Namespace, Name: cfg.VMI.Name, UID: cfg.VMI.UID}
	lease, err := RequestNetwork(ctx, filepath.Join(dir, contract.NotifySocketName), ref, log)
	if err != nil {
		return nil, err
	}
	offer, err := OfferFor(lease, readResolvConf())
	if err != nil {
		return nil, err
	}
	if err := StartDHCP(ctx, lease.Interface, offer, log); err != nil {
		return nil, err
	}
	log.Info("pod network ready", "interface", spec.Name, "tap", lease.Tap, "mac", offer.MAC.String(), "guestAddress", lease.Address, "gateway", lease.Gateway, "mtu", lease.MTU)
	// The card has the MAC the pod lets the guest send from and the DHCP server answers.
	return &domain.Interface{Tap: lease.Tap, MAC: offer.MAC.String(), MTU: uint(lease.MTU)}, nil
}

// startGuest defines and starts the VMI's domain.
func startGuest(ctx context.Context, conn *domain.Conn, cfg Config, dir string, prepared vmdisks.Prepared, iface *domain.Interface) error {
	vmi := &v1alpha1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Namespace: cfg.VMI.Namespace, Name: cfg.VMI.Name, UID: types.UID(cfg.VMI.UID)},
		Spec:       cfg.VMI.Spec,
	}
	accel, err := domain.ResolveAcceleration(ctx, conn, cfg.Acceleration, prepared.Kernel, prepared.Initrd)
	if err != nil {
		return fmt.Errorf("choosing the acceleration: %w", err)
	}
	xml, err := domain.DomainXML(vmi, domain.XMLOptions{
		Acceleration: accel, ConsoleLog: filepath.Join(dir, contract.ConsoleLog), ConsoleSocket: filepath.Join(dir, contract.ConsoleSocket),
		Kernel: prepared.Kernel, Initrd: prepared.Initrd, Disks: prepared.Disks, Interface: iface,
	})
	if err != nil {
		return err
	}
	if err := conn.DefineAndStart(xml); err != nil {
		return err
	}
	cfg.Log.Info("domain started", "domain", domain.DomainName(vmi.Namespace, vmi.Name), "acceleration", accel)
	return nil
}

// awaitGuest waits, as a migration target, until the domain runs here. A SIGTERM before that
// means the migration failed or was cancelled: there is nothing to keep, so the launcher ends.
// A libvirtd that dies meanwhile is restarted; the migration it was receiving fails with it (the
// new daemon does not take back an unfinished incoming guest), and the source keeps the guest.
func awaitGuest(ctx context.Context, s *daemonSession, name string, sigterm <-chan os.Signal, log *slog.Logger) (bool, error) {
	log.Info("migration target: waiting for the guest", "domain", name)
	events := s.Events()
	for {
		if state, _, err := s.Conn().State(name); err == nil && state == domain.Running {
			return true, nil
		}
		select {
		case _, ok := <-events:
			if !ok {
				if err := s.recover(ctx); err != nil {
					return false, fmt.Errorf("waiting for the guest: %w", err)
				}
				events = s.Events()
			}
		case <-sigterm:
			log.Info("SIGTERM before the guest arrived: the migration ended without this target")
			return false, nil
		case <-s.daemon.Done():
			if err := s.recover(ctx); err != nil {
				return false, fmt.Errorf("waiting for the guest: %w", err)
			}
			events = s.Events()
		case <-ctx.Done():
			return false, ctx.Err()
		}
	}
}

// confirmTimeout bounds the waits at a domain's end: for a migrated domain's undefinition, and
// for the stop event of a domain found gone.
const confirmTimeout = 10 * time.Second

// awaitUndefined waits until the named domain is undefined, the end of a migration's confirm
// phase. libvirt removes a domain migrated with VIR_MIGRATE_UNDEFINE_SOURCE without an Undefined
// event, so the domain's absence is watched for as well.
func awaitUndefined(conn *domain.Conn, events <-chan domain.Event, name string, log *slog.Logger) {
	timeout := time.After(confirmTimeout)
	poll := time.NewTicker(100 * time.Millisecond)
	defer poll.Stop()
	for {
		select {
		case ev, ok := <-events:
			if !ok || (ev.Domain == name && ev.Type == domain.EventUndefined) {
				return
			}
		case <-poll.C:
			if _, err := conn.Lookup(name); errors.Is(err, domain.ErrNotFound) {
				return
			}
		case <-timeout:
			log.Warn("the migrated domain was not undefined in time; exiting anyway", "waited", confirmTimeout)
			return
		}
	}
}

// exitCode reports whether the domain has ended, and the launcher exit code that says how.
func exitCode(conn *domain.Conn, name string) (int, bool) {
	state, reason, err := conn.State(name)
	if errors.Is(err, domain.ErrNotFound) {
		return contract.ExitGuestPoweredOff, true
	}
	if err != nil {
		return 0, false
	}
	return ExitCodeFor(state, reason)
}

// What an event tells of the domain's end (domainEnd).
const (
	endNot     = iota // it has not ended
	endKnown          // it ended, and how
	endUnknown        // it is gone, and its stop event, still to come, says how
)

// domainEnd is whether and how the domain has ended, from event ev or, where the event does not
// say (a pause, an event read late), from its state now (current). The reason returned is the
// one that decided: a migration away pauses the guest and then stops it, and a launcher that
// reads the pause's event after the stop must see "Migrated", not the pause's "Migration", or it
// exits before its hand-off runs the guest on the target and reports no migration to its agent.
// Asking libvirt after the event may find the domain already undefined (after a migration away,
// at once): then only the stop event can tell.
func domainEnd(ev domain.Event, current func() (domain.State, domain.Reason, error)) (code int, reason domain.Reason, end int) {
	if code, done := ExitCodeFor(ev.State, ev.Reason); done {
		return code, ev.Reason, endKnown
	}
	if ev.Type == domain.EventUndefined {
		return contract.ExitGuestPoweredOff, ev.Reason, endKnown
	}
	state, reason, err := current()
	switch {
	case errors.Is(err, domain.ErrNotFound):
		return 0, "", endUnknown
	case err != nil:
		return 0, "", endNot
	}
	if code, done := ExitCodeFor(state, reason); done {
		return code, reason, endKnown
	}
	return 0, "", endNot
}

// ExitCodeFor maps a domain's state to the launcher's exit code, if the domain has ended.
func ExitCodeFor(state domain.State, reason domain.Reason) (int, bool) {
	switch {
	case state == domain.Crashed, state == domain.Shutoff && reason == domain.ReasonCrashed:
		return contract.ExitCrashed, true
	case state == domain.Shutoff && reason == domain.ReasonDestroyed:
		return contract.ExitDestroyed, true
	case state == domain.Shutoff:
		return contract.ExitGuestPoweredOff, true
	}
	return 0, false
}
