package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"golang.org/x/term"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/evacuation/vm"
)

// errMigrationFailed is follow's exit status 1 when the migration failed: it has said why.
var errMigrationFailed = errors.New("the migration failed")

// followPoll is how often follow reads the migration and the VMI.
const followPoll = 250 * time.Millisecond

// downtimeWait is how long follow waits, once the guest runs on the target, for the target's
// agent to record how long the guest stood still (libvirt has the figure a moment later).
const downtimeWait = 10 * time.Second

// instanceMigrations are the migrations of the instance i among all: a user's migration names
// the VMI only; lifeboat's carry its UID too. Those made before the instance are another's.
func instanceMigrations(all []v1alpha1.VirtualMachineInstanceMigration, i *v1alpha1.VirtualMachineInstance) []v1alpha1.VirtualMachineInstanceMigration {
	return slices.DeleteFunc(all, func(m v1alpha1.VirtualMachineInstanceMigration) bool {
		uid, labelled := m.Labels[v1alpha1.LabelVMIUID]
		return m.Spec.VMIName != i.Name || (labelled && uid != string(i.UID)) || m.CreationTimestamp.Before(&i.CreationTimestamp)
	})
}

// latestOf is the latest made of the instance i's migrations (at least one). Creation times have
// seconds only: of two made in the same second, the one the VMI's own record names is the later.
func latestOf(migrations []v1alpha1.VirtualMachineInstanceMigration, i *v1alpha1.VirtualMachineInstance) v1alpha1.VirtualMachineInstanceMigration {
	return slices.MaxFunc(migrations, func(a, b v1alpha1.VirtualMachineInstanceMigration) int {
		if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
			return c
		}
		switch {
		case stateOf(&a, i) != nil:
			return 1
		case stateOf(&b, i) != nil:
			return -1
		}
		return 0
	})
}

// liveLine renders a migration's line (vm.MigrationLine): on a terminal, over the line drawn
// before (carriage return, the line cut to the terminal's width so that it does not wrap, clear
// to the end of the line); piped, a line of its own after the time.
func liveLine(line string, tty bool, width int, now time.Time) string {
	if !tty {
		return now.Format("15:04:05.0") + "  " + line + "\n"
	}
	if width > 1 && utf8.RuneCountInString(line) > width-1 {
		line = string([]rune(line)[:width-2]) + "…"
	}
	return "\r" + line + "\x1b[K"
}

// followed is what follow saw last: the migration it follows and the VMI.
type followed struct {
	ns, name string
	from     string // the node the VM ran on when follow began
	m        *v1alpha1.VirtualMachineInstanceMigration
	i        *v1alpha1.VirtualMachineInstance
}

// stateOf is the VMI's record of m, nil if it records another migration (or none).
func stateOf(m *v1alpha1.VirtualMachineInstanceMigration, i *v1alpha1.VirtualMachineInstance) *v1alpha1.VirtualMachineInstanceMigrationState {
	if s := i.Status.MigrationState; s != nil && s.MigrationUID == string(m.UID) {
		return s
	}
	return nil
}

// arrived reports whether the migration succeeded and the VMI runs on its target.
func (f followed) arrived() bool {
	return f.m != nil && f.m.Status.Phase == v1alpha1.MigrationSucceeded && f.i.Status.NodeName != "" &&
		(f.i.Status.NodeName == f.m.Status.TargetNode || f.m.Status.TargetNode == "")
}

// downtime is how long the migration stopped the guest, as the target's agent recorded it.
func (f followed) downtime() *time.Duration {
	if s := stateOf(f.m, f.i); s != nil && s.DowntimeMilliseconds != nil {
		d := time.Duration(*s.DowntimeMilliseconds) * time.Millisecond
		return &d
	}
	return nil
}

// summary says how a followed migration ended: where the VM runs now, how long the migration
// took and how long the guest stood still; or, failed, why and where the VM still runs.
func summary(f followed) string {
	m, i := f.m, f.i
	if m.Status.Phase == v1alpha1.MigrationFailed {
		reason := m.Status.FailureReason
		if reason == "" {
			reason = "no reason recorded"
		}
		where := fmt.Sprintf("VM %s/%s keeps running on node %s", f.ns, f.name, i.Status.NodeName)
		if i.Status.Phase != v1alpha1.VMIRunning || i.Status.NodeName == "" {
			where = fmt.Sprintf("VM %s/%s is %s on node %q", f.ns, f.name, cmpOr(string(i.Status.Phase), "in no phase"), i.Status.NodeName)
		}
		return fmt.Sprintf("migration %s failed: %s\n%s\n", m.Name, reason, where)
	}
	var b strings.Builder
	from := m.Status.SourceNode
	if from == "" {
		from = f.from
	}
	took := ""
	start, end := m.Status.StartTimestamp, m.Status.EndTimestamp
	if s := stateOf(m, i); s != nil && s.StartTimestamp != nil && s.EndTimestamp != nil {
		start, end = s.StartTimestamp, s.EndTimestamp
	}
	if start != nil && end != nil {
		took = fmt.Sprintf(" in %s", end.Sub(start.Time).Round(time.Millisecond))
	}
	mode := ""
	if m.Status.Mode != "" {
		mode = fmt.Sprintf(", mode %s", m.Status.Mode)
	}
	fmt.Fprintf(&b, "VM %s/%s now runs on node %s: migration %s moved it from node %s%s (cause %s%s)\n",
		f.ns, f.name, i.Status.NodeName, m.Name, from, took, cmpOr(string(m.Status.Cause), "not recorded"), mode)
	if d := f.downtime(); d != nil {
		fmt.Fprintf(&b, "the guest stood still for %s (libvirt's figure, recorded by node %s's agent)\n", d.Round(time.Millisecond), i.Status.NodeName)
	} else {
		fmt.Fprintf(&b, "the guest stood still for: not reported (node %s's agent recorded no downtime)\n", i.Status.NodeName)
	}
	return b.String()
}

func cmpOr(s, otherwise string) string {
	if s == "" {
		return otherwise
	}
	return s
}

// follower prints a followed migration's lines, redrawn in place on a terminal.
type follower struct {
	out   io.Writer
	tty   bool
	width int
	last  string
	drawn bool // a redrawn line is on the terminal, without its newline
}

// show prints the line if it changed.
func (p *follower) show(line string, now time.Time) {
	if line == p.last {
		return
	}
	p.last = line
	_, _ = io.WriteString(p.out, liveLine(line, p.tty, p.width, now))
	p.drawn = p.tty
}

// say prints whole lines, below a redrawn line.
func (p *follower) say(text string) {
	if p.drawn {
		_, _ = io.WriteString(p.out, "\n")
		p.drawn = false
	}
	_, _ = io.WriteString(p.out, text)
}

// terminal reports whether out is a terminal, and its width (0 if unknown).
func terminal(out io.Writer) (bool, int) {
	f, ok := out.(*os.File)
	if !ok || !term.IsTerminal(int(f.Fd())) {
		return false, 0
	}
	width, _, err := term.GetSize(int(f.Fd()))
	if err != nil {
		return true, 0
	}
	return true, width
}

// follow follows a migration of the VM's instance: the one named, or else the one running now or
// the next to start, printing its state as it changes until the guest runs on the target (then
// how long it took and how long the guest stood still) or the migration failed (then why, and
// errMigrationFailed), or timeout passed.
func (c *client) follow(ctx context.Context, name, migration string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	// Each read has a minute, past the deadline if need be: the deadline is follow's to keep.
	read := func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, time.Minute) }
	rctx, cancel := read()
	v, i, err := c.get(rctx, name)
	cancel()
	if err != nil {
		return err
	}
	if i == nil {
		return fmt.Errorf("VM %s/%s has no instance: there is no migration to follow", v.Namespace, v.Name)
	}
	tty, width := terminal(c.out)
	p := &follower{out: c.out, tty: tty, width: width}
	f := followed{ns: v.Namespace, name: v.Name, from: i.Status.NodeName, i: i}
	// Those over before follow began are not followed.
	over := map[string]bool{}
	if migration == "" {
		rctx, cancel := read()
		list, err := c.lb.LifeboatV1alpha1().VirtualMachineInstanceMigrations(v.Namespace).List(rctx, metav1.ListOptions{})
		cancel()
		if err != nil {
			return fmt.Errorf("listing the migrations of VM %s/%s: %w", v.Namespace, v.Name, err)
		}
		for _, m := range instanceMigrations(list.Items, i) {
			over[m.Name] = m.Status.Phase.Terminal()
		}
		p.say(fmt.Sprintf("following VM %s/%s, running on node %s\n", v.Namespace, v.Name, i.Status.NodeName))
	}
	var arrivedAt time.Time
	var lastErr error // the last read that failed, if the one after did not succeed
	for {
		now := time.Now()
		rctx, cancel := read()
		gone, err := c.look(rctx, &f, migration, over)
		cancel()
		lastErr = err
		if gone || apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err) {
			p.say("")
			return err
		}
		if err == nil {
			switch {
			case f.m == nil:
				p.show(fmt.Sprintf("waiting for a migration of VM %s/%s (on node %s)", f.ns, f.name, f.i.Status.NodeName), now)
			default:
				p.show(vm.MigrationLine(f.m, now), now)
			}
			if f.m != nil && f.m.Status.Phase == v1alpha1.MigrationFailed {
				p.say(summary(f))
				return errMigrationFailed
			}
			if f.arrived() {
				if arrivedAt.IsZero() {
					arrivedAt = now
				}
				if f.downtime() != nil || now.Sub(arrivedAt) >= downtimeWait {
					p.say(summary(f))
					return nil
				}
			}
		}
		if !time.Now().Before(deadline) {
			if f.arrived() {
				p.say(summary(f))
				return nil
			}
			p.say("")
			last := cmpOr(p.last, "nothing")
			if lastErr != nil {
				last += fmt.Sprintf(" (the last read failed: %v)", lastErr)
			}
			return fmt.Errorf("VM %s/%s: no migration ended within %s; last seen: %s", f.ns, f.name, timeout, last)
		}
		select {
		case <-ctx.Done():
			p.say("")
			return ctx.Err()
		case <-time.After(min(followPoll, time.Until(deadline))):
		}
	}
}

// look reads the VMI and the migration follow follows (the one named; or the latest of the
// instance's that was not over when follow began) into f. gone says the error is for good: the
// instance or the migration is gone.
func (c *client) look(ctx context.Context, f *followed, migration string, over map[string]bool) (gone bool, err error) {
	i, err := c.lb.LifeboatV1alpha1().VirtualMachineInstances(f.ns).Get(ctx, f.name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) || (err == nil && i.UID != f.i.UID) {
		return true, fmt.Errorf("the instance of VM %s/%s that was followed is gone", f.ns, f.name)
	}
	if err != nil {
		return false, fmt.Errorf("reading the instance of VM %s/%s: %w", f.ns, f.name, err)
	}
	f.i = i
	migrations := c.lb.LifeboatV1alpha1().VirtualMachineInstanceMigrations(f.ns)
	if f.m != nil {
		// The migration found is followed to its end.
		migration = f.m.Name
	}
	if migration != "" {
		m, err := migrations.Get(ctx, migration, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, fmt.Errorf("migration %s/%s is gone", f.ns, migration)
		}
		if err != nil {
			return false, fmt.Errorf("reading migration %s/%s: %w", f.ns, migration, err)
		}
		f.m = m
		return false, nil
	}
	list, err := migrations.List(ctx, metav1.ListOptions{})
	if err != nil {
		return false, fmt.Errorf("listing the migrations of VM %s/%s: %w", f.ns, f.name, err)
	}
	candidates := slices.DeleteFunc(instanceMigrations(list.Items, i), func(m v1alpha1.VirtualMachineInstanceMigration) bool { return over[m.Name] })
	if len(candidates) == 0 {
		return false, nil
	}
	latest := latestOf(candidates, i)
	f.m = &latest
	return false, nil
}
