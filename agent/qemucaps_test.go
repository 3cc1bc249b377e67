package agent

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/lifeboat-vm/lifeboat/agent/notifyserver"
	"github.com/lifeboat-vm/lifeboat/api/notify"
)

// A launcher that asks its agent for the node's QEMU capabilities gets a copy of the prober's
// file over its notify socket, a copy of its own: what it writes there reaches neither the
// node's file nor the next launcher. Before the prober has written the file, the answer says so.
func TestALauncherGetsItsOwnCopyOfTheNodesQEMUCapabilities(t *testing.T) {
	dir := t.TempDir()
	probed := filepath.Join(dir, "qemu-capabilities.xml")
	const caps = "<qemuCaps><emulator>/usr/bin/qemu-system-x86_64</emulator></qemuCaps>\n"

	s := notifyserver.New([]uint32{uint32(os.Getuid())}, func(*notify.Message, int32) {}, prometheus.NewRegistry(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	s.HandleQEMUCapabilities(QEMUCapabilities(probed))
	vmi := notify.VMIRef{Namespace: "ns", Name: "vm", UID: "u1"}
	socket := filepath.Join(dir, "notify.sock")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = s.Serve(ctx, socket, vmi) }()

	ask := func() (*notify.Message, *os.File) {
		t.Helper()
		var c net.Conn
		if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
			var err error
			c, err = net.Dial("unix", socket)
			return err == nil, nil
		}); err != nil {
			t.Fatalf("the agent does not serve %s within 10s: %v", socket, err)
		}
		defer c.Close()
		for _, k := range []notify.Kind{notify.KindHello, notify.KindQEMUCapabilities} {
			if err := notify.Write(c, &notify.Message{Kind: k, VMI: vmi, Time: time.Now()}); err != nil {
				t.Fatal(err)
			}
		}
		in := &notify.FileReader{Conn: c.(*net.UnixConn)}
		reply, err := notify.Read(in)
		if err != nil {
			t.Fatalf("reading the agent's answer: %v", err)
		}
		return reply, in.Take()
	}

	reply, f := ask()
	if f != nil || reply.Kind != notify.KindQEMUCapabilitiesFile || !strings.Contains(reply.Reason, "not probed") {
		t.Fatalf("before the probe: %+v with a file %t; want QEMUCapabilitiesFile saying they are not probed, no file", reply, f != nil)
	}

	if err := os.WriteFile(probed, []byte(caps), 0o644); err != nil {
		t.Fatal(err)
	}
	reply, f = ask()
	if f == nil {
		t.Fatalf("after the probe: %+v without a file", reply)
	}
	got, err := io.ReadAll(io.NewSectionReader(f, 0, 1<<20))
	if err != nil || string(got) != caps {
		t.Fatalf("the launcher's copy reads %q, %v; want the prober's file", got, err)
	}
	if _, err := f.WriteAt([]byte("<qemuCaps><emulator>/tmp/evil</emulator></qemuCaps>"), 0); err != nil {
		t.Fatalf("writing the launcher's own copy: %v", err)
	}
	f.Close()
	if b, _ := os.ReadFile(probed); !bytes.Equal(b, []byte(caps)) {
		t.Errorf("a launcher's write reached the node's file: %q", b)
	}
	_, f = ask()
	if got, _ := io.ReadAll(io.NewSectionReader(f, 0, 1<<20)); string(got) != caps {
		t.Errorf("the next launcher got %q; want the prober's file", got)
	}
	f.Close()
}
