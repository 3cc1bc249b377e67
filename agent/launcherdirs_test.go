package agent

import (
	"slices"
	"testing"
	"time"
)

func TestStaleLauncherDirs(t *testing.T) {
	now := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	const minAge = time.Minute
	old, recent := now.Add(-2*minAge), now.Add(-minAge/2)
	tests := []struct {
		name      string
		dir       LauncherDir
		pod       bool // a launcher pod of the VMI is on the node
		connected bool // the agent is connected to its launcher
		want      bool // removed
	}{
		{"pod deleted long ago: removed", LauncherDir{UID: "u", Changed: old}, false, false, true},
		{"pod still there (Succeeded after a migration away): kept", LauncherDir{UID: "u", Changed: old}, true, false, false},
		{"pod deleted but the agent still talks to its launcher: kept", LauncherDir{UID: "u", Changed: old}, false, true, false},
		{"no pod listed but the directory is new (a pod newer than the list): kept", LauncherDir{UID: "u", Changed: recent}, false, false, false},
		{"no pod listed and changed exactly minAge ago: removed", LauncherDir{UID: "u", Changed: now.Add(-minAge)}, false, false, true},
		{"never stat'ed (zero time) and no pod: removed", LauncherDir{UID: "u"}, false, false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pods := map[string]bool{"other": true}
			if tt.pod {
				pods[tt.dir.UID] = true
			}
			got := StaleLauncherDirs([]LauncherDir{tt.dir, {UID: "other", Changed: old}}, pods, func(uid string) bool { return tt.connected && uid == tt.dir.UID }, now, minAge)
			if removed := slices.Contains(got, tt.dir.UID); removed != tt.want {
				t.Errorf("StaleLauncherDirs() = %v: removes %s: %v, want %v", got, tt.dir.UID, removed, tt.want)
			}
			if slices.Contains(got, "other") {
				t.Errorf("StaleLauncherDirs() = %v removes the directory of a VMI whose pod is on the node", got)
			}
		})
	}
}
