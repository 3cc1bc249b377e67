package agent

import (
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/lifeboat-vm/lifeboat/api/notify"
)

// The source agent asks its launcher how much of the guest's RAM is resident and takes the answer
// that comes back through the notify socket: one timed before the question (meant for an earlier
// one) is not it. A launcher that does not answer in time is not asked again in that migration.
func TestTheSourceAgentAsksItsLauncherForTheGuestsResidentRAM(t *testing.T) {
	ref := notify.VMIRef{Namespace: "ns", Name: "vm", UID: "uid-vm"}
	for _, tc := range []struct {
		name      string
		answer    func(q *notify.Message) *notify.Message
		wantOK    bool
		wantAsked int64
	}{
		{"answered", func(q *notify.Message) *notify.Message {
			return &notify.Message{Kind: notify.KindGuestMemory, VMI: ref, Time: q.Time.Add(time.Millisecond), GuestMemoryResidentBytes: 300 << 20, GuestMemoryBytes: 1 << 30}
		}, true, 3},
		{"an answer to an earlier question only", func(q *notify.Message) *notify.Message {
			return &notify.Message{Kind: notify.KindGuestMemory, VMI: ref, Time: q.Time.Add(-time.Second), GuestMemoryResidentBytes: 300 << 20, GuestMemoryBytes: 1 << 30}
		}, false, 1},
		{"no answer", func(*notify.Message) *notify.Message { return nil }, false, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var asked atomic.Int64
			var a *fakeAgent
			a = newFakeAgent(t, Config{TellLauncher: func(uid string, m *notify.Message) bool {
				if uid != ref.UID || m.Kind != notify.KindGuestMemoryQuery || m.VMI != ref {
					t.Errorf("told the launcher of %s %s for %s, want a GuestMemoryQuery for %s", uid, m.Kind, m.VMI, ref)
				}
				asked.Add(1)
				if answer := tc.answer(m); answer != nil {
					go a.HandleNotify(answer, 1)
				}
				return true
			}})
			read := a.guestRAM(ref, slog.New(slog.NewTextHandler(io.Discard, nil)))
			for i := 0; i < 3; i++ {
				resident, size, ok := read()
				if ok != (tc.wantOK) || (ok && (resident != 300<<20 || size != 1<<30)) {
					t.Fatalf("reading %d: %d of %d, %v; want 300 MiB of 1 GiB: %v", i, resident, size, ok, tc.wantOK)
				}
			}
			if n := asked.Load(); n != tc.wantAsked {
				t.Errorf("asked %d times in three readings, want %d", n, tc.wantAsked)
			}
			answered := testutil.ToFloat64(a.metrics.GuestMemoryReadings.WithLabelValues(guestMemoryAnswered))
			unanswered := testutil.ToFloat64(a.metrics.GuestMemoryReadings.WithLabelValues(guestMemoryUnanswered))
			if tc.wantOK && (answered != 3 || unanswered != 0) || !tc.wantOK && (answered != 0 || unanswered != 1) {
				t.Errorf("readings counted %v answered, %v unanswered", answered, unanswered)
			}
		})
	}
}
