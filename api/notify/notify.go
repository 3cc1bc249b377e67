// Package notify is the wire protocol between a VM pod's launcher and its node's agent.
//
// A launcher connects to the agent's unix socket and sends frames; the agent never trusts a
// frame's size or content. A frame is a 4-byte header and a JSON body:
//
//	byte 0:    protocol version (Version)
//	byte 1:    reserved, zero
//	bytes 2-3: body length, big-endian, at most MaxBody
//	body:      one Message as JSON
//
// A frame that breaks any of these rules is an error; the agent then closes that connection
// only.
package notify

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"
)

const (
	// Version is the protocol version this package speaks.
	Version = 1
	// MaxBody is the largest body accepted. Messages are a few hundred bytes; the limit keeps a
	// misbehaving peer from making the agent allocate.
	MaxBody   = 16 << 10
	headerLen = 4
)

// Kind says what a message reports.
type Kind string

const (
	// KindHello is the first message on a connection: which VMI the launcher serves.
	KindHello Kind = "Hello"
	// KindDomainStarted reports that the launcher defined and started the domain.
	KindDomainStarted Kind = "DomainStarted"
	// KindGracefulShutdown reports that the launcher received SIGTERM (from the kubelet).
	KindGracefulShutdown Kind = "GracefulShutdown"
	// KindDomainGone reports that the domain no longer runs here and the launcher is exiting.
	KindDomainGone Kind = "DomainGone"
	// KindFailed reports that the launcher could not start the domain.
	KindFailed Kind = "Failed"
	// KindMigrated reports, from a migration's target launcher, how long the migration that
	// brought the guest stopped it (DowntimeMilliseconds, as libvirt measured it).
	KindMigrated Kind = "Migrated"
	// KindNetworkSetup asks the agent to build the guest's side of the pod network in the
	// launcher's network namespace, whose descriptor travels with the frame (SCM_RIGHTS). It is
	// the only message the agent answers: KindNetworkReady or KindNetworkFailed.
	KindNetworkSetup Kind = "NetworkSetup"
	// KindNetworkReady answers KindNetworkSetup: the network is built; Lease says what the
	// launcher's DHCP server offers the guest.
	KindNetworkReady Kind = "NetworkReady"
	// KindNetworkFailed answers KindNetworkSetup with why it could not be done (Reason).
	KindNetworkFailed Kind = "NetworkFailed"
	// KindHandoverDone tells a source launcher whose guest left by migration that its pod is no
	// longer needed: the pod's forward to the target pod has ended, or there was none. Until
	// then the launcher keeps its pod, and with it the network namespace the forward lives in,
	// for at most HandoverAtMost. Only the agent sends it.
	KindHandoverDone Kind = "HandoverDone"
	// KindLibvirtdRestarted reports that the launcher's libvirtd exited and the launcher started
	// it again; the guest ran on. Time is when the restart began, Reason says how many so far.
	KindLibvirtdRestarted Kind = "LibvirtdRestarted"
	// KindQEMUCapabilities asks the agent for what its node's QEMU can do, as libvirt's
	// capabilities cache file that the agent's own prober wrote, so that the launcher's
	// libvirtd need not probe QEMU itself. The agent answers KindQEMUCapabilitiesFile.
	KindQEMUCapabilities Kind = "QEMUCapabilities"
	// KindQEMUCapabilitiesFile answers KindQEMUCapabilities: a descriptor of a copy of the file,
	// made for this launcher alone, travels with the frame; without one, Reason says why the
	// agent has none.
	KindQEMUCapabilitiesFile Kind = "QEMUCapabilitiesFile"
	// KindGuestMemoryQuery asks a launcher how much of its guest's memory is resident now. The
	// source agent asks during a migration's first pass over memory: the guest has no more than
	// that in use, where its QEMU process's resident memory counts QEMU's own besides. Only the
	// agent sends it; the launcher answers KindGuestMemory, or nothing if it cannot tell.
	KindGuestMemoryQuery Kind = "GuestMemoryQuery"
	// KindGuestMemory answers KindGuestMemoryQuery: GuestMemoryResidentBytes of
	// GuestMemoryBytes, read at Time.
	KindGuestMemory Kind = "GuestMemory"
)

// HandoverAtMost bounds how long a source launcher waits for KindHandoverDone after its guest
// left: longer than the agent forwards (agent.ForwardAtMost), so that only an agent that
// restarted or lost the launcher's connection leaves it waiting that long.
const HandoverAtMost = 65 * time.Second

var kinds = map[Kind]bool{
	KindHello: true, KindDomainStarted: true, KindGracefulShutdown: true, KindDomainGone: true, KindFailed: true, KindMigrated: true,
	KindNetworkSetup: true, KindNetworkReady: true, KindNetworkFailed: true, KindHandoverDone: true, KindLibvirtdRestarted: true,
	KindQEMUCapabilities: true, KindQEMUCapabilitiesFile: true, KindGuestMemoryQuery: true, KindGuestMemory: true,
}

// Message is one report from a launcher.
type Message struct {
	Kind Kind `json:"kind"`
	// VMI identifies the VMI; every message carries it so the agent can check it matches the Hello.
	VMI VMIRef `json:"vmi"`
	// Time is when the launcher observed what it reports (for GracefulShutdown: the signal).
	Time time.Time `json:"time"`
	// PodGracePeriodSeconds is the pod's terminationGracePeriodSeconds (GracefulShutdown only).
	PodGracePeriodSeconds int64 `json:"podGracePeriodSeconds,omitempty"`
	// Reason says why, for DomainGone (the domain's stop reason: Shutdown, Destroyed, Crashed,
	// Migrated, ...) and Failed (an error message).
	Reason string `json:"reason,omitempty"`
	// DowntimeMilliseconds is how long the migration stopped the guest (Migrated only).
	DowntimeMilliseconds int64 `json:"downtimeMilliseconds,omitempty"`
	// Lease is what the guest gets by DHCP (NetworkReady only).
	Lease *Lease `json:"lease,omitempty"`
	// GuestMemoryResidentBytes is how much of the guest's RAM its QEMU process has resident, of
	// GuestMemoryBytes, the RAM's size (GuestMemory only).
	GuestMemoryResidentBytes uint64 `json:"guestMemoryResidentBytes,omitempty"`
	GuestMemoryBytes         uint64 `json:"guestMemoryBytes,omitempty"`
}

// Lease is the guest's network configuration, as the agent built it in the pod.
type Lease struct {
	// Interface is the bridge the launcher's DHCP server listens on.
	Interface string `json:"interface"`
	// Tap is the device QEMU opens.
	Tap string `json:"tap"`
	// Address is the guest's address with its prefix length (10.0.2.2/24).
	Address string `json:"address"`
	// Gateway is the guest's default gateway.
	Gateway string `json:"gateway"`
	// Server is the address the DHCP server answers from.
	Server string `json:"server"`
	// MTU is the pod interface's, for the guest's card.
	MTU int `json:"mtu"`
	// MAC is the guest's card's address: the only one the pod lets the guest send from and
	// the launcher's DHCP server answers. With the bridge binding it is the pod's own, the one
	// its CNI plugin gave eth0.
	MAC string `json:"mac"`
}

// VMIRef names a VMI.
type VMIRef struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	UID       string `json:"uid"`
}

func (r VMIRef) String() string { return r.Namespace + "/" + r.Name + " (" + r.UID + ")" }

// ReasonMigrated is a DomainGone reason: the guest left by live migration and runs elsewhere.
const ReasonMigrated = "Migrated"

// Errors a decoder returns for a malformed frame, for metrics and logs.
var (
	ErrVersion   = errors.New("unsupported protocol version")
	ErrReserved  = errors.New("reserved header byte is not zero")
	ErrTooLarge  = fmt.Errorf("frame body larger than %d bytes", MaxBody)
	ErrEmpty     = errors.New("empty frame body")
	ErrMalformed = errors.New("malformed message")
)

// Validate checks what a decoded message must hold.
func (m *Message) Validate() error {
	switch {
	case !kinds[m.Kind]:
		return fmt.Errorf("%w: unknown kind %q", ErrMalformed, m.Kind)
	case m.VMI.UID == "" || m.VMI.Name == "" || m.VMI.Namespace == "":
		return fmt.Errorf("%w: %s message without a full VMI reference", ErrMalformed, m.Kind)
	case m.Time.IsZero():
		return fmt.Errorf("%w: %s message without a time", ErrMalformed, m.Kind)
	case m.PodGracePeriodSeconds < 0:
		return fmt.Errorf("%w: negative pod grace period", ErrMalformed)
	case m.DowntimeMilliseconds < 0:
		return fmt.Errorf("%w: negative downtime", ErrMalformed)
	case (m.GuestMemoryResidentBytes != 0 || m.GuestMemoryBytes != 0) && m.Kind != KindGuestMemory:
		return fmt.Errorf("%w: guest memory in a %s message", ErrMalformed, m.Kind)
	case m.Kind == KindGuestMemory && (m.GuestMemoryBytes == 0 || m.GuestMemoryResidentBytes > m.GuestMemoryBytes):
		return fmt.Errorf("%w: %d bytes resident of a guest memory of %d", ErrMalformed, m.GuestMemoryResidentBytes, m.GuestMemoryBytes)
	}
	return nil
}

// Write encodes m as one frame.
func Write(w io.Writer, m *Message) error {
	if err := m.Validate(); err != nil {
		return err
	}
	body, err := json.Marshal(m)
	if err != nil {
		return err
	}
	if len(body) > MaxBody {
		return ErrTooLarge
	}
	frame := make([]byte, headerLen, headerLen+len(body))
	frame[0] = Version
	binary.BigEndian.PutUint16(frame[2:], uint16(len(body)))
	_, err = w.Write(append(frame, body...))
	return err
}

// Read decodes one frame. It returns io.EOF at a clean end of stream, io.ErrUnexpectedEOF for
// a frame cut short, and one of the Err values above (wrapped) for a malformed frame.
func Read(r io.Reader) (*Message, error) {
	var header [headerLen]byte
	if _, err := io.ReadFull(r, header[:]); err != nil {
		return nil, err
	}
	switch {
	case header[0] != Version:
		return nil, fmt.Errorf("%w %d (want %d)", ErrVersion, header[0], Version)
	case header[1] != 0:
		return nil, ErrReserved
	}
	n := int(binary.BigEndian.Uint16(header[2:]))
	switch {
	case n == 0:
		return nil, ErrEmpty
	case n > MaxBody:
		return nil, fmt.Errorf("%w: %d", ErrTooLarge, n)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	m := &Message{}
	if err := dec.Decode(m); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%w: trailing data after the message", ErrMalformed)
	}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return m, nil
}
