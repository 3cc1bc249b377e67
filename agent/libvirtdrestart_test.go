package agent

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/api/notify"
)

// TestEachLibvirtdRestartIsCountedAndRecordedOnce: a launcher's report that it restarted its
// libvirtd is counted and recorded as a Warning Event on the VMI once, though the launcher
// repeats it on each new connection; a later restart counts again.
func TestEachLibvirtdRestartIsCountedAndRecordedOnce(t *testing.T) {
	a := newFakeAgent(t, Config{})
	metrics, recorder := a.metrics, a.recorder
	if err := a.informers.Lifeboat().V1alpha1().VirtualMachineInstances().Informer().GetIndexer().Add(&v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "vm", UID: types.UID("uid-vm")}}); err != nil {
		t.Fatal(err)
	}
	vmi := notify.VMIRef{Namespace: "ns", Name: "vm", UID: "uid-vm"}
	first := time.Date(2026, 11, 28, 9, 0, 0, 0, time.UTC)
	restarted := func(at time.Time, reason string) {
		a.HandleNotify(&notify.Message{Kind: notify.KindLibvirtdRestarted, VMI: vmi, Time: at, Reason: reason}, 1)
	}
	restarted(first, "the launcher's libvirtd exited and was restarted (1 restart(s) so far)")
	restarted(first, "the launcher's libvirtd exited and was restarted (1 restart(s) so far)") // replayed
	restarted(first.Add(time.Minute), "the launcher's libvirtd exited and was restarted (2 restart(s) so far)")

	if got := testutil.ToFloat64(metrics.LauncherLibvirtdRestarts); got != 2 {
		t.Errorf("lifeboat_agent_launcher_libvirtd_restarts_total = %v, want 2", got)
	}
	var events []string
	for len(recorder.Events) > 0 {
		events = append(events, <-recorder.Events)
	}
	want := []string{
		"Warning LibvirtdRestarted On node node-a: the launcher's libvirtd exited and the launcher started it again (1 time(s) in the last 10m0s); the guest ran on",
		"Warning LibvirtdRestarted On node node-a: the launcher's libvirtd exited and the launcher started it again (2 time(s) in the last 10m0s); the guest ran on",
	}
	if strings.Join(events, "\n") != strings.Join(want, "\n") {
		t.Errorf("Events:\n%s\nwant:\n%s", strings.Join(events, "\n"), strings.Join(want, "\n"))
	}
}

// A launcher that reports more libvirtd restarts than a launcher makes (five in ten minutes, then
// it gives up), with text of its own, moves the counter by five and records five Events, none
// with its text; the rest are counted as dropped.
func TestALauncherCannotInflateItsLibvirtdRestarts(t *testing.T) {
	a := newFakeAgent(t, Config{})
	metrics, recorder := a.metrics, a.recorder
	if err := a.informers.Lifeboat().V1alpha1().VirtualMachineInstances().Informer().GetIndexer().Add(&v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "vm", UID: types.UID("uid-vm")}}); err != nil {
		t.Fatal(err)
	}
	vmi := notify.VMIRef{Namespace: "ns", Name: "vm", UID: "uid-vm"}
	start := time.Now()
	for i := range 100 {
		a.HandleNotify(&notify.Message{Kind: notify.KindLibvirtdRestarted, VMI: vmi, Time: start.Add(time.Duration(i) * time.Hour),
			Reason: "click here: " + strings.Repeat("x", 1000)}, 1)
	}
	if got := testutil.ToFloat64(metrics.LauncherLibvirtdRestarts); got != maxLibvirtdRestarts {
		t.Errorf("lifeboat_agent_launcher_libvirtd_restarts_total = %v, want %d", got, maxLibvirtdRestarts)
	}
	if got := testutil.ToFloat64(metrics.LibvirtdRestartReportsDropped); got != 100-maxLibvirtdRestarts {
		t.Errorf("lifeboat_agent_launcher_libvirtd_restart_reports_dropped_total = %v, want %d", got, 100-maxLibvirtdRestarts)
	}
	var events []string
	for len(recorder.Events) > 0 {
		events = append(events, <-recorder.Events)
	}
	if len(events) != maxLibvirtdRestarts {
		t.Errorf("%d Events, want %d", len(events), maxLibvirtdRestarts)
	}
	for _, e := range events {
		if strings.Contains(e, "click here") {
			t.Errorf("an Event carries the launcher's text: %.80s", e)
		}
	}
}

// A launcher that floods the agent with reports of its own text gets a few short lines in the
// agent's log, not its text at length nor a line for each; the reports are still handled.
func TestALauncherCannotFloodTheAgentsLog(t *testing.T) {
	var log strings.Builder
	a := newFakeAgent(t, Config{Log: slog.New(slog.NewJSONHandler(&log, nil))})
	metrics := a.metrics
	vmi := notify.VMIRef{Namespace: "ns", Name: "vm", UID: "uid-vm"}
	text := strings.Repeat("x", 16<<10)
	for range 1000 {
		a.HandleNotify(&notify.Message{Kind: notify.KindDomainStarted, VMI: vmi, Time: time.Now(), Reason: text}, 1)
	}
	lines := strings.Count(log.String(), "\n")
	if lines > 2*reportLogBurst {
		t.Errorf("1,000 reports made %d log lines, want at most %d", lines, 2*reportLogBurst)
	}
	if log.Len() > lines*(maxLoggedText+512) {
		t.Errorf("%d log lines hold %d bytes: a report's text is logged at length", lines, log.Len())
	}
	if got := testutil.ToFloat64(metrics.LauncherReportsUnlogged); got < 1000-2*reportLogBurst {
		t.Errorf("lifeboat_agent_launcher_reports_unlogged_total = %v, want the reports over the budget counted", got)
	}
}
