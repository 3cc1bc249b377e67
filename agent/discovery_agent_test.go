package agent

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/record"

	lifeboatfake "github.com/lifeboat-vm/lifeboat/api/client/clientset/versioned/fake"
	lifeboatinformers "github.com/lifeboat-vm/lifeboat/api/client/informers/externalversions"
	lifeboatv1alpha1informers "github.com/lifeboat-vm/lifeboat/api/client/informers/externalversions/lifeboat/v1alpha1"
	contract "github.com/lifeboat-vm/lifeboat/api/launcher"
)

// The agent keeps serving through an inotify overflow (issue 45, N7): held up while a launcher
// churns files in its run volume, it loses events for real, counts a rescan, and still goes on
// to the next launcher that comes, where it used to exit and stop every evacuation on its node.
func TestTheAgentKeepsServingThroughAnInotifyOverflow(t *testing.T) {
	limit, err := os.ReadFile("/proc/sys/fs/inotify/max_queued_events")
	if err != nil {
		t.Fatal(err)
	}
	queue, err := strconv.Atoi(strings.TrimSpace(string(limit)))
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	launcher := func(uid string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Join(root, uid), 0o755); err != nil {
			t.Fatal(err)
		}
		l, err := net.Listen("unix", filepath.Join(root, uid, contract.LibvirtSocket))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
	}
	// Which launchers the agent dials: no libvirt answers in this test.
	dialed := make(chan string, 1000)
	dial := func(_ context.Context, _, uid string) (DomainConn, error) {
		select {
		case dialed <- uid:
		default:
		}
		return nil, errors.New("no libvirt in this test")
	}
	metrics := NewMetrics(prometheus.NewRegistry())
	client := lifeboatfake.NewSimpleClientset()
	informers := lifeboatinformers.NewSharedInformerFactory(client, 0)
	a, err := New(Config{NodeName: "node", DomainsDir: root, Dial: dial, Metrics: metrics, Recorder: record.NewFakeRecorder(10),
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Configs: informers.Lifeboat().V1alpha1().LifeboatConfigs().Lister()},
		client, informers.Lifeboat().V1alpha1().VirtualMachineInstances(), informers.Lifeboat().V1alpha1().LifeboatConfigs(),
		[]lifeboatv1alpha1informers.VirtualMachineInstanceMigrationInformer{informers.Lifeboat().V1alpha1().VirtualMachineInstanceMigrations()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	informers.Start(ctx.Done())
	launcher("churner")
	errc := make(chan error, 1)
	go func() { errc <- a.Run(ctx, 1) }()
	waitDialed := func(want string) {
		t.Helper()
		deadline := time.After(30 * time.Second)
		for {
			select {
			case uid := <-dialed:
				if uid == want {
					return
				}
			case err := <-errc:
				t.Fatalf("the agent ended: %v", err)
			case <-deadline:
				t.Fatalf("the agent did not dial launcher %s within 30s", want)
			}
		}
	}
	waitDialed("churner")

	// Hold the agent up: with its launchers' lock taken, it stops at the next directory that
	// goes, and reads no further event; the churn's events pile up in the kernel's queue.
	a.mu.Lock()
	for _, dir := range []string{"brief-1", "brief-2"} {
		if err := os.Mkdir(filepath.Join(root, dir), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(filepath.Join(root, dir)); err != nil {
			t.Fatal(err)
		}
	}
	for i := range queue {
		f := filepath.Join(root, "churner", strconv.Itoa(i))
		if err := os.WriteFile(f, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(f); err != nil {
			t.Fatal(err)
		}
	}
	a.mu.Unlock()

	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		select {
		case err := <-errc:
			t.Fatalf("the agent ended on the overflow: %v", err)
		default:
		}
		return testutil.ToFloat64(metrics.LauncherRescans) >= 1, nil
	})
	if err != nil {
		t.Fatalf("lifeboat_agent_launcher_rescans_total = %v 30s after %d events past a queue of %d; want a rescan",
			testutil.ToFloat64(metrics.LauncherRescans), 2*queue, queue)
	}
	launcher("next")
	waitDialed("next")
}
