package domain

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"libvirt.org/go/libvirt"
)

// Socket file names in a VMI's directory for a migration through the agents' proxies. The
// directory has the same path on both nodes, so the names mean the same on both: on the
// source node the agent's proxy listens on them, on the target node the launcher's libvirt
// and QEMU do (libvirt-sock, and the socket the destination QEMU creates for the stream).
const (
	MigrationLibvirtSocket = "migration-libvirt.sock"
	MigrationQEMUSocket    = "migration-qemu.sock"
	// MigrationNBDSocket is where the destination QEMU's NBD server takes the disks' copy.
	MigrationNBDSocket = "migration-nbd.sock"
)

// ProxiedURIs are the DestURI and MigrateURI of a migration through the agents' proxies
// from and to the VMI directory vmiDir. The destination daemon is of the source's kind
// (session says which, Conn.Session): launchers of one release run their daemons alike.
func ProxiedURIs(vmiDir string, session bool) (destURI, migrateURI string) {
	return SocketURI(filepath.Join(vmiDir, MigrationLibvirtSocket), session), "unix://" + filepath.Join(vmiDir, MigrationQEMUSocket)
}

// ProxiedDisksURI is the DisksURI of a migration through the agents' proxies from and to vmiDir.
func ProxiedDisksURI(vmiDir string) string {
	return "unix://" + filepath.Join(vmiDir, MigrationNBDSocket)
}

// MigrateOptions say where and how Migrate moves a domain.
type MigrateOptions struct {
	// DestURI is the destination daemon's libvirt URI as the source daemon reaches it, such
	// as SocketURI of the migration-libvirt.sock the source agent's proxy listens on.
	DestURI string
	// MigrateURI is where the source QEMU sends the memory stream and where the
	// destination QEMU listens for it: unix:///path (the proxied socket, the same path on
	// both nodes) or tcp://host:port.
	MigrateURI string
	// ListenAddress is the address the destination QEMU listens on for a tcp:// MigrateURI;
	// empty for unix:// (the socket path says it all) or to leave libvirt's default.
	ListenAddress string
	// Bandwidth caps the pre-copy transfer, in bytes per second; 0 is no cap. libvirt
	// takes MiB/s, so it is rounded up to whole MiB/s.
	Bandwidth uint64
	// AutoConverge lets QEMU throttle the guest's vCPUs when memory is dirtied faster than
	// it is sent.
	AutoConverge bool
	// MaxDowntime is the longest QEMU may stop the guest for a pre-copy migration's final copy
	// (libvirt's maximum downtime, QEMU's downtime-limit); 0 leaves QEMU's default, 300 ms.
	// It is whole milliseconds.
	MaxDowntime time.Duration
	// AllowPostCopy prepares the migration so that StartPostCopy can switch it to post-copy
	// later; the migration starts as pre-copy either way.
	AllowPostCopy bool
	// PostCopyResume resumes a migration that broke in post-copy (the domain waits paused,
	// reason PostcopyFailed, on both daemons; no guest runs anywhere) over new connections to
	// the same URIs. libvirt then continues where the stream stopped, from the source's memory.
	PostCopyResume bool
	// DisksURI, when set (unix:///path, the proxied NBD socket), copies the top image of every
	// writable disk that is not shared (containerDisk overlays) to the destination, whose own
	// overlay on the same backing image receives it; the images below are on both nodes already.
	DisksURI string
	// SynchronousDiskWrites mirrors the guest's writes to the copied disks synchronously (QEMU's
	// write-blocking mirror) once the copy has begun: a write completes when both nodes have it.
	// Without it, a guest that writes faster than the copy moves keeps the copy from ever catching
	// up, and the memory transfer, which starts only once it has, never starts.
	SynchronousDiskWrites bool
	// SharedDisks says the writable disks that are not copied are on storage both nodes share,
	// attached shareable and uncached (ReadWriteMany claims): Kubernetes vouches for the sharing,
	// and libvirt, which recognises only some shared file systems, is told not to check it again.
	SharedDisks bool
	// PausedOnArrival leaves the guest paused on the destination when the migration ends, for
	// HandOff to run it there once the source has given it up: libvirt would otherwise run it
	// at once, even when the source's daemon never hears back and runs it again too. libvirt
	// refuses it with AllowPostCopy, where the destination runs the guest before the end.
	PausedOnArrival bool
}

// migrateFlags are the libvirt flags for opts. A lifeboat migration is always live (the
// guest runs while its memory is copied) and peer-to-peer (the source daemon drives it, so
// it goes on without the agent's connection to the destination), never tunnelled through
// libvirt's own connection (QEMU's stream goes through its own proxied socket, which is
// faster), and moves the definition with the guest: the domain belongs to the destination
// launcher afterwards and to the source launcher no more.
func migrateFlags(opts MigrateOptions) libvirt.DomainMigrateFlags {
	flags := libvirt.MIGRATE_LIVE | libvirt.MIGRATE_PEER2PEER | libvirt.MIGRATE_PERSIST_DEST | libvirt.MIGRATE_UNDEFINE_SOURCE
	if opts.AutoConverge {
		flags |= libvirt.MIGRATE_AUTO_CONVERGE
	}
	if opts.AllowPostCopy || opts.PostCopyResume {
		flags |= libvirt.MIGRATE_POSTCOPY
	}
	if opts.PostCopyResume {
		flags |= libvirt.MIGRATE_POSTCOPY_RESUME
	}
	if opts.DisksURI != "" {
		flags |= libvirt.MIGRATE_NON_SHARED_INC
		if opts.SynchronousDiskWrites {
			flags |= libvirt.MIGRATE_NON_SHARED_SYNCHRONOUS_WRITES
		}
	}
	if opts.SharedDisks {
		flags |= libvirt.MIGRATE_UNSAFE
	}
	if opts.PausedOnArrival {
		flags |= libvirt.MIGRATE_PAUSED
	}
	return flags
}

// bandwidthMiB is a bytes-per-second cap in libvirt's MiB/s, rounded up so that a small
// non-zero cap does not become 0, which libvirt reads as no cap.
func bandwidthMiB(bytesPerSecond uint64) uint64 {
	const mib = 1 << 20
	return (bytesPerSecond + mib - 1) / mib
}

// migrateParams are libvirt's typed parameters for opts.
func migrateParams(opts MigrateOptions) *libvirt.DomainMigrateParameters {
	p := &libvirt.DomainMigrateParameters{URISet: true, URI: opts.MigrateURI}
	if opts.ListenAddress != "" {
		p.ListenAddressSet, p.ListenAddress = true, opts.ListenAddress
	}
	if opts.Bandwidth > 0 {
		p.BandwidthSet, p.Bandwidth = true, bandwidthMiB(opts.Bandwidth)
	}
	if opts.DisksURI != "" {
		p.DisksURISet, p.DisksURI = true, opts.DisksURI
	}
	return p
}

// abortRetry is how often Migrate tries again to abort a job that has not started yet.
const abortRetry = 100 * time.Millisecond

// Migrate live-migrates the named domain to another daemon and returns when the migration
// has ended: with nil once the guest runs on the destination and the source domain is gone.
//
// Cancelling ctx aborts the migration: the guest keeps running on the source, nothing is
// left on the destination, and the error wraps ctx's error. A migration past the point of
// no return (switched to post-copy, or already completing) cannot be aborted; Migrate then
// waits for its end and returns nil if the guest did arrive, since that is where it runs.
func (c *Conn) Migrate(ctx context.Context, name string, opts MigrateOptions) error {
	if opts.DestURI == "" || opts.MigrateURI == "" {
		return fmt.Errorf("migrating domain %q: the destination's libvirt URI and migration URI are both needed", name)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("migrating domain %q: %w", name, err)
	}
	dom, err := c.lookup(name)
	if err != nil {
		return err
	}
	defer dom.Free()
	// The migration waits on a connection of its own. On a connection with a call waiting in
	// a migration, libvirt's client held other calls back until the next keepalive (5 s,
	// measured with the daemon's RPC log): the convergence policy's statistics and its pause
	// came late by that much, against a deadline.
	mc, err := connectURI(c.uri)
	if err != nil {
		return fmt.Errorf("migrating domain %q: %w", name, err)
	}
	defer mc.Close()
	mdom, err := mc.lookup(name)
	if err != nil {
		return err
	}
	defer mdom.Free()

	if opts.MaxDowntime > 0 && !opts.PostCopyResume {
		// Set before the start: libvirt keeps QEMU's migration parameters that the migration's
		// own do not name, and puts back after it what they were at its start.
		if err := dom.MigrateSetMaxDowntime(uint64(opts.MaxDowntime.Milliseconds()), 0); err != nil {
			return fmt.Errorf("migrating domain %q: setting its maximum downtime: %w", name, err)
		}
	}
	done := make(chan error, 1)
	go func() { done <- mdom.MigrateToURI3(opts.DestURI, migrateParams(opts), migrateFlags(opts)) }()
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("migrating domain %q to %s over %s: %w", name, opts.DestURI, opts.MigrateURI, err)
		}
		return nil
	case <-ctx.Done():
	}
	migrateErr, abortErr := abortUntilDone(dom, done)
	if migrateErr == nil {
		return nil
	}
	if abortErr != nil {
		return fmt.Errorf("migrating domain %q: %w; aborting it failed: %w; the migration ended with: %w", name, ctx.Err(), abortErr, migrateErr)
	}
	return fmt.Errorf("migrating domain %q: %w; the migration was aborted: %w", name, ctx.Err(), migrateErr)
}

// abortUntilDone aborts the domain's job and waits for the migration's result on done.
// An abort can come before libvirt has started the job, and then fails: it is repeated
// until it succeeds or the migration ends, so a cancelled migration never runs on unchecked.
// The last abort error is returned only if no abort succeeded.
func abortUntilDone(dom *libvirt.Domain, done <-chan error) (migrateErr, abortErr error) {
	ticker := time.NewTicker(abortRetry)
	defer ticker.Stop()
	for {
		if abortErr = dom.AbortJob(); abortErr == nil {
			return <-done, nil
		}
		select {
		case err := <-done:
			return err, abortErr
		case <-ticker.C:
		}
	}
}

// postCopyBandwidthMiB is the post-copy phase's cap in MiB/s: none in practice (1 TiB/s). libvirt
// documents an unset post-copy cap as none, but QEMU 10 then keeps the pre-copy cap
// (TestARestrictedVMIsReceivedInPostCopy saw 5 MiB/s in post-copy under a 4 MiB/s cap).
const postCopyBandwidthMiB = 1 << 20

// StartPostCopy switches the named domain's running migration, started with
// AllowPostCopy, to post-copy: the guest moves to the destination at once and fetches the
// memory it still lacks from the source on demand. It is the end of the road for a
// migration that does not converge: from here it can no longer be aborted, and if the
// connection between the nodes breaks, the guest waits paused on both until a Migrate with
// PostCopyResume carries on (the source holds the only copy of the pages still to send).
//
// The post-copy phase is uncapped first (postCopyBandwidthMiB): once the guest runs on the
// destination it stalls on every page still missing, and the source's pod is killed at the
// deadline with whatever pages it still holds.
func (c *Conn) StartPostCopy(name string) error {
	dom, err := c.lookup(name)
	if err != nil {
		return err
	}
	defer dom.Free()
	if err := dom.MigrateSetMaxSpeed(postCopyBandwidthMiB, libvirt.MIGRATE_MAX_SPEED_POSTCOPY); err != nil {
		return fmt.Errorf("lifting the post-copy bandwidth cap of domain %q: %w", name, err)
	}
	if err := dom.MigrateStartPostCopy(0); err != nil {
		return fmt.Errorf("switching the migration of domain %q to post-copy: %w", name, err)
	}
	return nil
}

// Suspend pauses the named domain's vCPUs. During a migration this stops the guest from
// dirtying memory, so the migration converges at the cost of the guest's time paused.
// The guest runs again on the destination when the migration ends: libvirt (9.0) resumes
// it there since Migrate does not ask for VIR_MIGRATE_PAUSED, although it was paused on
// the source. If the migration fails instead, the guest stays paused on the source.
func (c *Conn) Suspend(name string) error {
	dom, err := c.lookup(name)
	if err != nil {
		return err
	}
	defer dom.Free()
	if err := dom.Suspend(); err != nil {
		return fmt.Errorf("pausing domain %q: %w", name, err)
	}
	return nil
}

// Resume runs the named domain's vCPUs again: after a migration that failed once the guest
// was paused to make it converge, the guest must run on where it is.
func (c *Conn) Resume(name string) error {
	dom, err := c.lookup(name)
	if err != nil {
		return err
	}
	defer dom.Free()
	if err := dom.Resume(); err != nil {
		return fmt.Errorf("resuming domain %q: %w", name, err)
	}
	return nil
}
