package launcher

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"github.com/google/renameio/v2"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/lifeboat-vm/lifeboat/api/notify"
	"github.com/lifeboat-vm/lifeboat/domain"
)

// qemuCapsBudget bounds how long a launcher waits for its agent's copy of the node's QEMU
// capabilities, counted from the launcher's start: less than the probe it saves (0.3-0.6 s on
// the benchmark machine), so that a slow or absent agent costs little. The agent normally
// serves the launcher's socket before the launcher starts, and answers in a few milliseconds.
const qemuCapsBudget = 500 * time.Millisecond

// qemuCaps is the answer to a launcher's request for the node's QEMU capabilities.
type qemuCaps struct {
	caps []byte
	err  error
	took time.Duration
}

// fetchQEMUCapabilities asks the agent for the node's QEMU capabilities within qemuCapsBudget;
// the answer comes on the channel returned.
func fetchQEMUCapabilities(ctx context.Context, path string, ref notify.VMIRef) <-chan qemuCaps {
	out := make(chan qemuCaps, 1)
	go func() {
		start := time.Now()
		ctx, cancel := context.WithTimeout(ctx, qemuCapsBudget)
		defer cancel()
		caps, err := requestQEMUCapabilities(ctx, path, ref)
		out <- qemuCaps{caps: caps, err: err, took: time.Since(start)}
	}()
	return out
}

// requestQEMUCapabilities asks the agent, on the notify socket at path, for the QEMU
// capabilities its node's prober found, trying to connect until ctx ends (the agent may not
// serve the socket yet).
func requestQEMUCapabilities(ctx context.Context, path string, ref notify.VMIRef) ([]byte, error) {
	var c net.Conn
	var dialErr error
	if err := wait.PollUntilContextCancel(ctx, 20*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		c, dialErr = (&net.Dialer{}).DialContext(ctx, "unix", path)
		return dialErr == nil, nil
	}); err != nil {
		return nil, fmt.Errorf("connecting to the agent: %w", errors.Join(dialErr, err))
	}
	conn := c.(*net.UnixConn)
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	for _, m := range []*notify.Message{
		{Kind: notify.KindHello, VMI: ref, Time: time.Now()},
		{Kind: notify.KindQEMUCapabilities, VMI: ref, Time: time.Now()},
	} {
		if err := notify.Write(conn, m); err != nil {
			return nil, err
		}
	}
	in := &notify.FileReader{Conn: conn}
	defer in.CloseAll()
	reply, err := notify.Read(in)
	if err == nil {
		err = in.Err()
	}
	if err != nil {
		return nil, fmt.Errorf("reading the agent's answer: %w", err)
	}
	if reply.Kind != notify.KindQEMUCapabilitiesFile {
		return nil, fmt.Errorf("the agent answered %s to QEMUCapabilities", reply.Kind)
	}
	f := in.Take()
	if f == nil {
		return nil, errors.New(reply.Reason)
	}
	defer f.Close()
	// One byte past the bound is enough for CheckQEMUCapabilities to refuse a larger file.
	caps, err := io.ReadAll(io.NewSectionReader(f, 0, domain.MaxQEMUCapabilities+1))
	if err == nil {
		err = domain.CheckQEMUCapabilities(caps)
	}
	if err != nil {
		return nil, err
	}
	return caps, nil
}

// ProbeQEMU finds what this machine's QEMU can do, with a libvirtd of its own in dir as a
// launcher's would (this process's user, its access to /dev/kvm), and writes libvirt's
// capabilities cache file to out, for the node's agent to give each new launcher.
func ProbeQEMU(ctx context.Context, dir, out string) error {
	if os.Geteuid() == 0 {
		return errors.New("probing as root would describe a root libvirtd's QEMU; run it as the launchers' user")
	}
	daemon, err := domain.StartLibvirtd(ctx, domain.Config{Dir: dir})
	if err != nil {
		return fmt.Errorf("starting a libvirtd to probe QEMU: %w", err)
	}
	defer daemon.Stop()
	conn, err := domain.Connect(daemon.Socket())
	if err != nil {
		return err
	}
	defer conn.Close()
	if err := conn.LoadQEMUCapabilities(); err != nil {
		return err
	}
	caps, err := daemon.QEMUCapabilities()
	if err != nil {
		return err
	}
	// Renamed into place whole: the agent may read it at any moment.
	return renameio.WriteFile(out, caps, 0o644)
}
