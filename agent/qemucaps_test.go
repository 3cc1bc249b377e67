package agent

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
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

	reg := prometheus.NewRegistry()
	s := notifyserver.New([]uint32{uint32(os.Getuid())}, func(*notify.Message, int32) {}, reg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	// The newest probe pod's file first, as during a rolling update; it has not written one.
	s.HandleQEMUCapabilities(QEMUCapabilities(func() []string { return []string{filepath.Join(dir, "newer.xml"), probed} }))
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
	if f != nil || reply.Kind != notify.KindQEMUCapabilitiesFile || !strings.Contains(reply.Reason, "has written no capabilities") {
		t.Fatalf("before the probe: %+v with a file %t; want QEMUCapabilitiesFile saying the probe has written none, no file", reply, f != nil)
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
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP lifeboat_agent_qemu_capabilities_answers_total Answers to launchers asking for the node's probed QEMU capabilities: given (a copy of the probe's file) or none (the launcher probes QEMU itself).
# TYPE lifeboat_agent_qemu_capabilities_answers_total counter
lifeboat_agent_qemu_capabilities_answers_total{result="given"} 2
lifeboat_agent_qemu_capabilities_answers_total{result="none"} 1
`), "lifeboat_agent_qemu_capabilities_answers_total"); err != nil {
		t.Errorf("the agent's count of its answers: %v", err)
	}
}

func TestQEMUProbeFiles(t *testing.T) {
	at := func(s int) metav1.Time { return metav1.NewTime(time.Unix(int64(s), 0)) }
	pod := func(uid string, created int, phase corev1.PodPhase) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "probe-" + uid, UID: types.UID(uid), CreationTimestamp: at(created)}, Status: corev1.PodStatus{Phase: phase}}
	}
	file := func(uid string) string {
		return "/pods/" + uid + "/volumes/kubernetes.io~empty-dir/qemu-capabilities/capabilities.xml"
	}
	got := QEMUProbeFiles([]*corev1.Pod{
		pod("old", 1, corev1.PodRunning), pod("new", 5, corev1.PodRunning), pod("pending", 9, corev1.PodPending), pod("failed", 7, corev1.PodFailed),
	}, "/pods")
	if want := []string{file("new"), file("old")}; !slices.Equal(got, want) {
		t.Errorf("QEMUProbeFiles = %v, want the running pods' files, newest first: %v", got, want)
	}
	if got := QEMUProbeFiles(nil, "/pods"); len(got) != 0 {
		t.Errorf("QEMUProbeFiles(no pods) = %v, want none", got)
	}
}
