package domain

import "libvirt.org/go/libvirt"

// State is what a domain is doing, a small view of libvirt's domain states.
type State string

const (
	NoState      State = "NoState"
	Running      State = "Running"
	Paused       State = "Paused"
	ShuttingDown State = "ShuttingDown"
	Shutoff      State = "Shutoff"
	Crashed      State = "Crashed"
	PMSuspended  State = "PMSuspended"
)

// Reason says why a domain is in its state. The names follow KubeVirt's.
type Reason string

const (
	ReasonUnknown           Reason = "Unknown"
	ReasonBooted            Reason = "Booted"
	ReasonMigrated          Reason = "Migrated"
	ReasonRestored          Reason = "Restored"
	ReasonFromSnapshot      Reason = "FromSnapshot"
	ReasonUnpaused          Reason = "Unpaused"
	ReasonMigrationCanceled Reason = "MigrationCanceled"
	ReasonSaveCanceled      Reason = "SaveCanceled"
	ReasonWakeUp            Reason = "WakeUp"
	ReasonCrashed           Reason = "Crashed"
	ReasonPostcopy          Reason = "Postcopy"
	ReasonPostcopyFailed    Reason = "PostcopyFailed"
	ReasonUser              Reason = "User"
	ReasonMigration         Reason = "Migration"
	ReasonSave              Reason = "Save"
	ReasonDump              Reason = "Dump"
	ReasonIOError           Reason = "IOError"
	ReasonWatchdog          Reason = "Watchdog"
	ReasonShuttingDown      Reason = "ShuttingDown"
	ReasonSnapshot          Reason = "Snapshot"
	ReasonStartingUp        Reason = "StartingUp"
	ReasonAPIError          Reason = "APIError"
	ReasonShutdown          Reason = "Shutdown"
	ReasonDestroyed         Reason = "Destroyed"
	ReasonSaved             Reason = "Saved"
	ReasonFailed            Reason = "Failed"
	ReasonDaemon            Reason = "Daemon"
	ReasonPanicked          Reason = "Panicked"
	ReasonGuest             Reason = "Guest"
	ReasonHost              Reason = "Host"
)

var runningReasons = map[libvirt.DomainRunningReason]Reason{
	libvirt.DOMAIN_RUNNING_BOOTED:             ReasonBooted,
	libvirt.DOMAIN_RUNNING_MIGRATED:           ReasonMigrated,
	libvirt.DOMAIN_RUNNING_RESTORED:           ReasonRestored,
	libvirt.DOMAIN_RUNNING_FROM_SNAPSHOT:      ReasonFromSnapshot,
	libvirt.DOMAIN_RUNNING_UNPAUSED:           ReasonUnpaused,
	libvirt.DOMAIN_RUNNING_MIGRATION_CANCELED: ReasonMigrationCanceled,
	libvirt.DOMAIN_RUNNING_SAVE_CANCELED:      ReasonSaveCanceled,
	libvirt.DOMAIN_RUNNING_WAKEUP:             ReasonWakeUp,
	libvirt.DOMAIN_RUNNING_CRASHED:            ReasonCrashed,
	libvirt.DOMAIN_RUNNING_POSTCOPY:           ReasonPostcopy,
	libvirt.DOMAIN_RUNNING_POSTCOPY_FAILED:    ReasonPostcopyFailed,
}

var pausedReasons = map[libvirt.DomainPausedReason]Reason{
	libvirt.DOMAIN_PAUSED_USER:            ReasonUser,
	libvirt.DOMAIN_PAUSED_MIGRATION:       ReasonMigration,
	libvirt.DOMAIN_PAUSED_SAVE:            ReasonSave,
	libvirt.DOMAIN_PAUSED_DUMP:            ReasonDump,
	libvirt.DOMAIN_PAUSED_IOERROR:         ReasonIOError,
	libvirt.DOMAIN_PAUSED_WATCHDOG:        ReasonWatchdog,
	libvirt.DOMAIN_PAUSED_FROM_SNAPSHOT:   ReasonFromSnapshot,
	libvirt.DOMAIN_PAUSED_SHUTTING_DOWN:   ReasonShuttingDown,
	libvirt.DOMAIN_PAUSED_SNAPSHOT:        ReasonSnapshot,
	libvirt.DOMAIN_PAUSED_CRASHED:         ReasonCrashed,
	libvirt.DOMAIN_PAUSED_STARTING_UP:     ReasonStartingUp,
	libvirt.DOMAIN_PAUSED_POSTCOPY:        ReasonPostcopy,
	libvirt.DOMAIN_PAUSED_POSTCOPY_FAILED: ReasonPostcopyFailed,
	libvirt.DOMAIN_PAUSED_API_ERROR:       ReasonAPIError,
}

var shutdownReasons = map[libvirt.DomainShutdownReason]Reason{
	libvirt.DOMAIN_SHUTDOWN_USER: ReasonUser,
}

var shutoffReasons = map[libvirt.DomainShutoffReason]Reason{
	libvirt.DOMAIN_SHUTOFF_SHUTDOWN:      ReasonShutdown,
	libvirt.DOMAIN_SHUTOFF_DESTROYED:     ReasonDestroyed,
	libvirt.DOMAIN_SHUTOFF_CRASHED:       ReasonCrashed,
	libvirt.DOMAIN_SHUTOFF_MIGRATED:      ReasonMigrated,
	libvirt.DOMAIN_SHUTOFF_SAVED:         ReasonSaved,
	libvirt.DOMAIN_SHUTOFF_FAILED:        ReasonFailed,
	libvirt.DOMAIN_SHUTOFF_FROM_SNAPSHOT: ReasonFromSnapshot,
	libvirt.DOMAIN_SHUTOFF_DAEMON:        ReasonDaemon,
}

var crashedReasons = map[libvirt.DomainCrashedReason]Reason{
	libvirt.DOMAIN_CRASHED_PANICKED: ReasonPanicked,
}

// stateFromLibvirt maps libvirt's state and its state-specific reason code.
func stateFromLibvirt(state libvirt.DomainState, reason int) (State, Reason) {
	switch state {
	case libvirt.DOMAIN_RUNNING:
		return Running, reasonOf(runningReasons, libvirt.DomainRunningReason(reason))
	case libvirt.DOMAIN_BLOCKED:
		// Blocked means running but waiting on a resource: for lifeboat the guest runs.
		return Running, ReasonUnknown
	case libvirt.DOMAIN_PAUSED:
		return Paused, reasonOf(pausedReasons, libvirt.DomainPausedReason(reason))
	case libvirt.DOMAIN_SHUTDOWN:
		return ShuttingDown, reasonOf(shutdownReasons, libvirt.DomainShutdownReason(reason))
	case libvirt.DOMAIN_SHUTOFF:
		return Shutoff, reasonOf(shutoffReasons, libvirt.DomainShutoffReason(reason))
	case libvirt.DOMAIN_CRASHED:
		return Crashed, reasonOf(crashedReasons, libvirt.DomainCrashedReason(reason))
	case libvirt.DOMAIN_PMSUSPENDED:
		return PMSuspended, ReasonUnknown
	}
	return NoState, ReasonUnknown
}

func reasonOf[K comparable](reasons map[K]Reason, code K) Reason {
	if r, ok := reasons[code]; ok {
		return r
	}
	return ReasonUnknown
}
