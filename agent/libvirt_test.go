package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"libvirt.org/go/libvirt"
	"strconv"

	"github.com/lifeboat-vm/lifeboat/agent/libvirtclient"
	contract "github.com/lifeboat-vm/lifeboat/api/launcher"
	"github.com/lifeboat-vm/lifeboat/domain"
)

// The agent's libvirt client runs in a child of its own, and the child holds nothing a hostile
// daemon's reply could turn against the node (N5): looked at from outside, as an operator would
// with ps and /proc, it runs as nobody (neither root nor the launchers' user), with no capability
// and no way to gain one, in its own network, mount, PID and IPC namespaces, and its root holds
// the relay's directory alone, not the agent's files. It still does its work: it lists the
// launcher daemon's domains and passes on their lifecycle events. Cutting its connection kills it.
func TestTheLibvirtClientRunsConfined(t *testing.T) {
	needRoot(t)
	root, err := os.MkdirTemp("", "confined")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	if err := os.Chmod(root, 0o755); err != nil { // the daemon's user reaches its directory
		t.Fatal(err)
	}
	// A file of the agent's that anyone on the node may read.
	secret := filepath.Join(root, "agent-file")
	if err := os.WriteFile(secret, []byte("the agent's"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	daemon, err := domain.StartLibvirtd(ctx, domain.Config{Dir: filepath.Join(root, "daemon"), User: &domain.User{UID: contract.UID, GID: contract.UID}})
	if err != nil {
		t.Fatalf("starting the launcher's libvirtd: %v", err)
	}
	t.Cleanup(func() { _ = daemon.Stop() })

	conn, err := LibvirtDialer(filepath.Join(root, "relays"), slog.Default())(ctx, daemon.Socket(), "confined")
	if err != nil {
		t.Fatalf("connecting to the launcher's libvirt: %v", err)
	}
	defer conn.Close()
	names, err := conn.DomainNames(ctx)
	if err != nil || len(names) != 0 {
		t.Fatalf("the launcher's domains through the confined client: %v, %v; want none, no error", names, err)
	}
	pid := conn.(*libvirtConn).client.Pid()
	proc := fmt.Sprintf("/proc/%d", pid)

	fields := statusFields(t, proc+"/status")
	nobody := fmt.Sprintf("%d %d %d %d", libvirtclient.ChildUID, libvirtclient.ChildUID, libvirtclient.ChildUID, libvirtclient.ChildUID)
	nogroup := fmt.Sprintf("%d %d %d %d", libvirtclient.ChildGID, libvirtclient.ChildGID, libvirtclient.ChildGID, libvirtclient.ChildGID)
	for k, want := range map[string]string{
		"Uid": nobody, "Gid": nogroup, "Groups": "",
		"CapEff": "0000000000000000", "CapPrm": "0000000000000000", "CapInh": "0000000000000000", "CapAmb": "0000000000000000",
		"NoNewPrivs": "1",
	} {
		if got := fields[k]; got != want {
			t.Errorf("the child's %s: %q, want %q", k, got, want)
		}
	}
	// Its own seccomp filter on top of the agent's (none here; the container's under a runtime),
	// on each of its threads.
	agentFilters, err := strconv.Atoi(statusFields(t, "/proc/self/status")["Seccomp_filters"])
	if err != nil {
		t.Fatal(err)
	}
	tasks, err := os.ReadDir(proc + "/task")
	if err != nil {
		t.Fatal(err)
	}
	if len(tasks) < 2 {
		t.Errorf("the child has %d threads; a Go program has several, which the filter must all reach", len(tasks))
	}
	for _, task := range tasks {
		thread := statusFields(t, proc+"/task/"+task.Name()+"/status")
		for k, want := range map[string]string{"Seccomp": "2", "Seccomp_filters": strconv.Itoa(agentFilters + 1), "NoNewPrivs": "1"} {
			if got := thread[k]; got != want {
				t.Errorf("the child's thread %s: %s %q, want %q (the agent has %d filters)", task.Name(), k, got, want, agentFilters)
			}
		}
	}
	for _, id := range []int{0, contract.UID} {
		if libvirtclient.ChildUID == id || libvirtclient.ChildGID == id {
			t.Errorf("the child runs as %d:%d, which is root's or the launchers' (%d)", libvirtclient.ChildUID, libvirtclient.ChildGID, id)
		}
	}
	t.Logf("the child %d: Uid %s, Gid %s, CapEff %s, CapBnd %s, NoNewPrivs %s, Seccomp_filters %s, %d threads, VmRSS %s (RssAnon %s)", pid, fields["Uid"], fields["Gid"], fields["CapEff"], fields["CapBnd"], fields["NoNewPrivs"], fields["Seccomp_filters"], len(tasks), fields["VmRSS"], fields["RssAnon"])
	// Not dumpable: its /proc files are root's, although it runs as nobody.
	var st syscall.Stat_t
	if err := syscall.Stat(proc+"/status", &st); err != nil || st.Uid != 0 {
		t.Errorf("the child's /proc/%d/status belongs to %d (%v); want root's, as for a process that is not dumpable", pid, st.Uid, err)
	}
	// The first the kernel kills when the agent's container runs out of memory.
	if adj, err := os.ReadFile(proc + "/oom_score_adj"); err != nil || strings.TrimSpace(string(adj)) != "1000" {
		t.Errorf("the child's oom_score_adj: %q, %v; want 1000", adj, err)
	}
	for _, ns := range []string{"net", "mnt", "pid", "ipc"} {
		mine, err1 := os.Readlink("/proc/self/ns/" + ns)
		its, err2 := os.Readlink(proc + "/ns/" + ns)
		if err := errors.Join(err1, err2); err != nil {
			t.Fatal(err)
		}
		if mine == its {
			t.Errorf("the child shares the agent's %s namespace %s", ns, mine)
		}
	}
	// Its root holds the relay's directory, and in it the relay's socket, and nothing else.
	entries, err := os.ReadDir(proc + "/root")
	if err != nil {
		t.Fatal(err)
	}
	var seen []string
	for _, e := range entries {
		seen = append(seen, e.Name())
	}
	if !slices.Equal(seen, []string{"relay"}) {
		t.Errorf("the child's root holds %q; want the relay's directory alone", seen)
	}
	if entries, err := os.ReadDir(proc + "/root/relay"); err != nil || len(entries) != 1 || entries[0].Name() != relaySocket {
		t.Errorf("the child's relay directory: %v, %v; want the relay's socket alone", entries, err)
	}
	if _, err := os.Stat(proc + "/root" + secret); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the agent's file %s as the child sees it: %v; want it absent", secret, err)
	}

	// It passes on the daemon's lifecycle events, on which the agent acts (a guest that stops,
	// a migration's switch-over): a domain defined there is a change the agent sees.
	direct, err := libvirt.NewConnect(domain.SocketURI(daemon.Socket(), true))
	if err != nil {
		t.Fatalf("connecting to the launcher's libvirtd directly: %v", err)
	}
	defer direct.Close()
	dom, err := direct.DomainDefineXML(`<domain type='qemu'><name>events</name><memory unit='MiB'>16</memory><os><type arch='x86_64'>hvm</type></os></domain>`)
	if err != nil {
		t.Fatalf("defining a domain on the launcher's libvirtd: %v", err)
	}
	defer func() { _ = dom.Undefine(); _ = dom.Free() }()
	select {
	case <-conn.(*libvirtConn).Changes():
	case <-time.After(30 * time.Second):
		t.Fatal("the agent saw no lifecycle event 30 s after a domain was defined on the launcher's daemon")
	}

	// Cutting the connection kills the child.
	conn.(*libvirtConn).Cut()
	if err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		_, err := os.Stat(proc)
		return errors.Is(err, os.ErrNotExist), nil
	}); err != nil {
		t.Fatalf("the child %d is still there 10 s after its connection was cut", pid)
	}
	if _, err := conn.DomainNames(ctx); !errors.Is(err, libvirtclient.ErrCut) {
		t.Errorf("a call after the cut: %v; want %v", err, libvirtclient.ErrCut)
	}
}

// statusFields reads a /proc status file into its fields, each value's words joined by a space.
func statusFields(t *testing.T, path string) map[string]string {
	t.Helper()
	status, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	fields := map[string]string{}
	for _, line := range strings.Split(string(status), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			fields[k] = strings.Join(strings.Fields(v), " ")
		}
	}
	return fields
}
