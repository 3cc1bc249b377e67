package domain

import (
	"context"
	"errors"
	"testing"
	"time"

	"libvirt.org/go/libvirtxml"
)

// These tests run against libvirt's test driver (test:///default): a real libvirt API
// with in-memory domains, fast enough for what needs no guest.

// testDriver connects to a fresh test driver; test:///default is one shared instance per
// process, so each test uses domains of its own names.
func testDriver(t *testing.T) *Conn {
	t.Helper()
	c, err := connectURI("test:///default")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// testDomainXML is a domain the test driver can run, with lifeboat's metadata.
func testDomainXML(t *testing.T, name string, m Metadata) string {
	t.Helper()
	metadata, err := marshalMetadata(m)
	if err != nil {
		t.Fatal(err)
	}
	dom := &libvirtxml.Domain{
		Type:     "test",
		Name:     name,
		Metadata: &libvirtxml.DomainMetadata{XML: metadata},
		Memory:   &libvirtxml.DomainMemory{Value: 128, Unit: "MiB"},
		OS:       &libvirtxml.DomainOS{Type: &libvirtxml.DomainOSType{Arch: "x86_64", Type: "hvm"}},
	}
	out, err := dom.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestTestDriverLifecycle(t *testing.T) {
	c := testDriver(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	events, err := c.Events(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const name = "lifecycle"
	if err := c.DefineAndStart(testDomainXML(t, name, Metadata{Namespace: "ns", Name: "vm", UID: "u"})); err != nil {
		t.Fatal(err)
	}

	if e, err := waitEvent(ctx, events, name, EventStarted); err != nil {
		t.Fatal(err)
	} else if want := (Event{Domain: name, Type: EventStarted, State: Running, Reason: ReasonBooted}); e != want {
		t.Errorf("Started event = %+v, want %+v", e, want)
	}
	if state, reason, err := c.State(name); err != nil || state != Running || reason != ReasonBooted {
		t.Errorf("State() = %s, %s, %v, want %s, %s", state, reason, err, Running, ReasonBooted)
	}
	// The test driver has no ACPI power button; the real daemon's tests press it.
	if err := c.Destroy(name); err != nil {
		t.Fatal(err)
	}
	if e, err := waitEvent(ctx, events, name, EventStopped); err != nil {
		t.Fatal(err)
	} else if e.State != Shutoff || e.Reason != ReasonDestroyed {
		t.Errorf("Stopped event after Destroy = %+v, want %s, %s", e, Shutoff, ReasonDestroyed)
	}
	if state, reason, err := c.State(name); err != nil || state != Shutoff || reason != ReasonDestroyed {
		t.Errorf("State() after Destroy = %s, %s, %v, want %s, %s", state, reason, err, Shutoff, ReasonDestroyed)
	}
}

func TestTestDriverMetadata(t *testing.T) {
	c := testDriver(t)
	const name = "metadata"
	want := Metadata{Namespace: "ns", Name: "vm", UID: "4b0b5c4e-5a55-4a3f-9a0e-3d3a0c8b1b11"}
	if err := c.DefineAndStart(testDomainXML(t, name, want)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Destroy(name) })

	got, err := c.Metadata(name)
	if err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Errorf("Metadata() = %+v, want %+v", got, want)
	}
	gs := GracefulShutdown{SignalTime: time.Unix(1_800_000_000, 0).UTC(), Deadline: time.Unix(1_800_000_030, 0).UTC()}
	if err := c.SetGracefulShutdown(name, gs); err != nil {
		t.Fatal(err)
	}
	got, err = c.Metadata(name)
	if err != nil {
		t.Fatal(err)
	}
	if got.GracefulShutdown == nil || *got.GracefulShutdown != gs || got.UID != want.UID {
		t.Errorf("Metadata() after SetGracefulShutdown = %+v (%+v), want %+v with the VMI kept", got, got.GracefulShutdown, gs)
	}
}

func TestTestDriverMissingDomain(t *testing.T) {
	c := testDriver(t)
	for op, call := range map[string]func() error{
		"Lookup":   func() error { _, err := c.Lookup("missing"); return err },
		"State":    func() error { _, _, err := c.State("missing"); return err },
		"Shutdown": func() error { return c.Shutdown("missing") },
		"Destroy":  func() error { return c.Destroy("missing") },
		"JobStats": func() error { _, err := c.JobStats("missing"); return err },
		"Metadata": func() error { _, err := c.Metadata("missing"); return err },
	} {
		if err := call(); !errors.Is(err, ErrNotFound) {
			t.Errorf("%s() of a missing domain = %v, want ErrNotFound", op, err)
		}
	}
}

func TestEventsEndWhenTheConnectionCloses(t *testing.T) {
	c, err := connectURI("test:///default")
	if err != nil {
		t.Fatal(err)
	}
	events, err := c.Events(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case _, ok := <-events:
		if ok {
			t.Error("an event arrived after Close, want the stream closed")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the event stream is still open 10s after Close")
	}
}
