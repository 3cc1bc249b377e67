package agent

import (
	"testing"

	"k8s.io/utils/ptr"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
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
		{"post-copy broke: never resumed here", Orphan{Connected: true, Domain: DomainPaused, Mode: v1alpha1.MigrationModePostCopy}, RecoveryFailed, false},
		{"the domain is gone from the source: it left", Orphan{Connected: true, Mode: v1alpha1.MigrationModePreCopy}, RecoverySucceeded, false},
		{"launcher not reconnected yet", Orphan{Mode: v1alpha1.MigrationModePreCopy}, RecoveryWait, false},
		{"launcher exited 0: the guest left by migration", Orphan{LauncherExit: ptr.To[int32](0), Mode: v1alpha1.MigrationModePreCopy}, RecoverySucceeded, false},
		{"launcher failed: the migration failed", Orphan{LauncherExit: ptr.To[int32](1), Mode: v1alpha1.MigrationModePreCopy}, RecoveryFailed, false},
		{"launcher killed: the migration failed", Orphan{LauncherExit: ptr.To[int32](137), Mode: v1alpha1.MigrationModePaused}, RecoveryFailed, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, resume := RecoverSource(tc.o)
			if got != tc.want || resume != tc.wantResume {
				t.Errorf("RecoverSource(%+v) = %v, resume %v; want %v, resume %v", tc.o, got, resume, tc.want, tc.wantResume)
			}
		})
	}
}
