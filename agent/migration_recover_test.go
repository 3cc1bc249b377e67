package agent

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	lifeboatfake "github.com/lifeboat-vm/lifeboat/api/client/clientset/versioned/fake"
	lifeboatinformers "github.com/lifeboat-vm/lifeboat/api/client/informers/externalversions"
	lifeboatv1alpha1informers "github.com/lifeboat-vm/lifeboat/api/client/informers/externalversions/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/domain"
	"github.com/lifeboat-vm/lifeboat/test/nodecert"
)

func TestRecoverSource(t *testing.T) {
	for _, tc := range []struct {
		name       string
		o          Orphan
		want       Recovery
		wantResume bool
	}{
		{"libvirt still ends the broken job", Orphan{Connected: true, JobActive: true, Domain: DomainRunning, Mode: v1alpha1.MigrationModePreCopy}, RecoveryWait, false},
		{"pre-copy broke: the guest runs on here", Orphan{Connected: true, Domain: DomainRunning, Mode: v1alpha1.MigrationModePreCopy}, RecoveryFailed, false},
		{"auto-converge broke: the guest runs on here", Orphan{Connected: true, Domain: DomainRunning, Mode: v1alpha1.MigrationModeAutoConverge}, RecoveryFailed, false},
		{"paused to converge, then broke: resume it here", Orphan{Connected: true, Domain: DomainPaused, Mode: v1alpha1.MigrationModePaused}, RecoveryFailed, true},
		{"post-copy broke: resume the migration", Orphan{Connected: true, Domain: DomainPaused, PostCopyBroken: true, Mode: v1alpha1.MigrationModePostCopy}, RecoveryResumePostCopy, false},
		{"post-copy broke while libvirt still ends the job: resume the migration", Orphan{Connected: true, JobActive: true, Domain: DomainPaused, PostCopyBroken: true, Mode: v1alpha1.MigrationModePostCopy}, RecoveryResumePostCopy, false},
		{"paused in post-copy, not broken: never resumed here", Orphan{Connected: true, Domain: DomainPaused, Mode: v1alpha1.MigrationModePostCopy}, RecoveryFailed, false},
		{"the domain is gone from the source: it left", Orphan{Connected: true, Mode: v1alpha1.MigrationModePreCopy}, RecoverySucceeded, false},
		{"launcher not reconnected yet", Orphan{Mode: v1alpha1.MigrationModePreCopy}, RecoveryWait, false},
		{"launcher exited 0: the guest left by migration", Orphan{LauncherExit: ptr.To[int32](0), Mode: v1alpha1.MigrationModePreCopy}, RecoverySucceeded, false},
		{"launcher failed: the migration failed", Orphan{LauncherExit: ptr.To[int32](1), Mode: v1alpha1.MigrationModePreCopy}, RecoveryFailed, false},
		{"launcher killed: the migration failed", Orphan{LauncherExit: ptr.To[int32](137), Mode: v1alpha1.MigrationModePaused}, RecoveryFailed, false},
		{"the target runs the guest, the source's pod is gone with its exit code: it left", Orphan{TargetRan: true, Mode: v1alpha1.MigrationModePaused}, RecoverySucceeded, false},
		{"the target runs the guest, the source's still paused: it left", Orphan{TargetRan: true, Connected: true, Domain: DomainPaused, Mode: v1alpha1.MigrationModePaused}, RecoverySucceeded, false},
		{"in post-copy the target runs the guest before the migration ends: resume the migration", Orphan{TargetRan: true, Connected: true, Domain: DomainPaused, PostCopyBroken: true, Mode: v1alpha1.MigrationModePostCopy}, RecoveryResumePostCopy, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, resume := RecoverSource(tc.o)
			if got != tc.want || resume != tc.wantResume {
				t.Errorf("RecoverSource(%+v) = %v, resume %v; want %v, resume %v", tc.o, got, resume, tc.want, tc.wantResume)
			}
		})
	}
}

// orphanedPostCopy is a source launcher's libvirt after its agent restarted during a post-copy
// migration: the domain waits paused (PostcopyFailed), libvirt still holding the broken job,
// until a migration with PostCopyResume finishes it. A resume succeeds only while the agent's
// proxy for the memory stream listens in the launcher's directory.
type orphanedPostCopy struct {
	*stuckMigrator
	dir     string
	mu      sync.Mutex
	resumes []domain.MigrateOptions
	proxied bool
	left    bool
}

func (o *orphanedPostCopy) Observe(context.Context, string) (*Domain, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.left {
		return nil, nil
	}
	return &Domain{State: DomainPaused}, nil
}

func (o *orphanedPostCopy) Changes() <-chan struct{}               { return nil }
func (o *orphanedPostCopy) Shutdown(context.Context, string) error { return errors.New("not expected") }
func (o *orphanedPostCopy) Destroy(context.Context, string) error  { return errors.New("not expected") }
func (o *orphanedPostCopy) Close() error                           { return nil }
func (o *orphanedPostCopy) DomainNames(context.Context) ([]string, error) {
	return []string{"ns_vm"}, nil
}
func (o *orphanedPostCopy) JobStats(string) (domain.JobStats, error) {
	return domain.JobStats{Type: domain.JobUnbounded}, nil
}
func (o *orphanedPostCopy) DirtyRate(string) (uint64, bool, error) { return 0, false, nil }

func (o *orphanedPostCopy) State(string) (domain.State, domain.Reason, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.left {
		return domain.NoState, domain.ReasonUnknown, domain.ErrNotFound
	}
	return domain.Paused, domain.ReasonPostcopyFailed, nil
}

func (o *orphanedPostCopy) Migrate(_ context.Context, _ string, opts domain.MigrateOptions) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.resumes = append(o.resumes, opts)
	if _, err := os.Stat(filepath.Join(o.dir, domain.MigrationQEMUSocket)); err != nil {
		return err
	}
	o.proxied = true
	if !opts.PostCopyResume {
		return errors.New("a new migration of a domain in post-copy")
	}
	o.left = true
	return nil
}

// TestARestartedAgentResumesABrokenPostCopy: an agent that restarts during a post-copy migration
// (its proxies, and so the migration's connections, died with it) finds the guest paused on the
// source with its memory split between the nodes, opens the proxies again and resumes the
// migration, which then succeeds, rather than recording it failed and losing the guest.
func TestARestartedAgentResumesABrokenPostCopy(t *testing.T) {
	vmi := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "vm", UID: "uid-vm"}}
	vmi.Status.Phase, vmi.Status.NodeName = v1alpha1.VMIRunning, "source"
	vmi.Status.MigrationState = &v1alpha1.VirtualMachineInstanceMigrationState{MigrationName: "mig", MigrationUID: "uid-mig", Mode: v1alpha1.MigrationModePostCopy}
	mig := &v1alpha1.VirtualMachineInstanceMigration{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "mig", UID: "uid-mig"},
		Spec: v1alpha1.VirtualMachineInstanceMigrationSpec{VMIName: "vm"}}
	mig.Status = v1alpha1.VirtualMachineInstanceMigrationStatus{Phase: v1alpha1.MigrationRunning, Mode: v1alpha1.MigrationModePostCopy,
		SourceNode: "source", TargetNode: "target", Cause: v1alpha1.MigrationCauseNodePressure,
		TargetProxy: &v1alpha1.MigrationProxy{Libvirt: "127.0.0.2:1", Memory: "127.0.0.2:2", PostCopy: true}}
	config := &v1alpha1.LifeboatConfig{ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.ConfigName}}
	config.Spec.Migrations.AllowPostCopy = ptr.To(true)

	client := lifeboatfake.NewSimpleClientset(vmi, mig, config)
	recorder := record.NewFakeRecorder(100)
	informers := lifeboatinformers.NewSharedInformerFactory(client, 0)
	clk := clocktesting.NewFakeClock(time.Now())
	domains := t.TempDir()
	a, err := New(Config{
		NodeName: "source", Recorder: recorder, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), DomainsDir: domains,
		Certificates: nodecert.Issue(t, nodecert.NewCA(t), "source"),
		Configs:      informers.Lifeboat().V1alpha1().LifeboatConfigs().Lister(), Clock: clk,
	}, client, informers.Lifeboat().V1alpha1().VirtualMachineInstances(), informers.Lifeboat().V1alpha1().LifeboatConfigs(),
		[]lifeboatv1alpha1informers.VirtualMachineInstanceMigrationInformer{informers.Lifeboat().V1alpha1().VirtualMachineInstanceMigrations()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	informers.Start(ctx.Done())
	informers.WaitForCacheSync(ctx.Done())
	dir := filepath.Join(domains, string(vmi.UID))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	libvirt := &orphanedPostCopy{stuckMigrator: newStuckMigrator(), dir: dir}
	a.mu.Lock()
	a.launchers[string(vmi.UID)] = &launcher{conn: libvirt}
	a.mu.Unlock()

	if _, err := a.migrations.recoverSource(ctx, mig); err != nil {
		t.Fatalf("recoverSource() = %v", err)
	}
	var got *v1alpha1.VirtualMachineInstanceMigration
	// The resume waits a second of the agent's clock before its first attempt.
	if !stepUntil(ctx, clk, postCopyResumeRetry, func() bool {
		got, err = client.LifeboatV1alpha1().VirtualMachineInstanceMigrations("ns").Get(ctx, "mig", metav1.GetOptions{})
		return err == nil && got.Status.Phase.Terminal()
	}) {
		t.Fatalf("the migration did not end within 10 s of real time: %+v", got.Status)
	}
	libvirt.mu.Lock()
	defer libvirt.mu.Unlock()
	if got.Status.Phase != v1alpha1.MigrationSucceeded || got.Status.Mode != v1alpha1.MigrationModePostCopy {
		t.Errorf("migration after the restart: phase %s, mode %s, reason %q; want Succeeded, PostCopy", got.Status.Phase, got.Status.Mode, got.Status.FailureReason)
	}
	if len(libvirt.resumes) != 1 || !libvirt.resumes[0].PostCopyResume || !libvirt.proxied {
		t.Errorf("the launcher's libvirt was asked %d migrations (%+v), its proxy listening: %v; want one with PostCopyResume, through a proxy", len(libvirt.resumes), libvirt.resumes, libvirt.proxied)
	}
	var events []string
	for len(recorder.Events) > 0 {
		events = append(events, <-recorder.Events)
	}
	if !strings.Contains(strings.Join(events, "\n"), "PostCopyResuming") {
		t.Errorf("events %q: want a PostCopyResuming Event on the migration", events)
	}
}

// An orphaned migration whose VMI is gone, or is another instance of the same name (its VM was
// started again elsewhere: the soak at 58dadfc, where such a migration stayed Running and every
// later migration of the VM was refused for it), fails at once, and the new instance is left
// alone.
func TestAnOrphanedMigrationOfAVMIThatIsNoMoreFails(t *testing.T) {
	for _, tc := range []struct {
		name string
		vmi  *v1alpha1.VirtualMachineInstance
	}{
		{"the VMI is gone", nil},
		{"the VMI is another instance", func() *v1alpha1.VirtualMachineInstance {
			v := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "vm", UID: "uid-vm-2"}}
			v.Status.Phase, v.Status.NodeName = v1alpha1.VMIRunning, "elsewhere"
			return v
		}()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mig := &v1alpha1.VirtualMachineInstanceMigration{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "mig", UID: "uid-mig"},
				Spec: v1alpha1.VirtualMachineInstanceMigrationSpec{VMIName: "vm"}}
			mig.Status = v1alpha1.VirtualMachineInstanceMigrationStatus{Phase: v1alpha1.MigrationRunning, Mode: v1alpha1.MigrationModePreCopy,
				SourceNode: "source", TargetNode: "target"}
			f := newFakeAgent(t, Config{NodeName: "source"})
			client := f.client
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if _, err := client.LifeboatV1alpha1().VirtualMachineInstanceMigrations("ns").Create(ctx, mig, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			if tc.vmi != nil {
				if _, err := client.LifeboatV1alpha1().VirtualMachineInstances("ns").Create(ctx, tc.vmi, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			f.informers.Start(ctx.Done())
			f.informers.WaitForCacheSync(ctx.Done())
			if _, err := f.migrations.recoverSource(ctx, mig); err != nil {
				t.Fatalf("recoverSource() = %v", err)
			}
			got, err := client.LifeboatV1alpha1().VirtualMachineInstanceMigrations("ns").Get(ctx, "mig", metav1.GetOptions{})
			if err != nil || got.Status.Phase != v1alpha1.MigrationFailed || got.Status.FailureReason == "" {
				t.Fatalf("migration %+v, %v: want Failed with a reason", got.Status, err)
			}
			if tc.vmi != nil {
				v, err := client.LifeboatV1alpha1().VirtualMachineInstances("ns").Get(ctx, "vm", metav1.GetOptions{})
				if err != nil || v.Status.MigrationState != nil || v.Status.NodeName != "elsewhere" {
					t.Errorf("the new instance's status %+v, %v: want it untouched", v.Status, err)
				}
			}
		})
	}
}
