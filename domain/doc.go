// Package domain is everything lifeboat does with libvirt: it turns a VirtualMachineInstance
// into domain XML, runs a VM pod's private libvirt daemon, starts, watches and stops domains,
// and keeps lifeboat's own record (the VMI it belongs to, a pending graceful shutdown) in
// the domain's metadata, where it survives a restart of the agent and moves with a migration.
//
// It is the only package in lifeboat that imports libvirt; the rest see the small types here.
//
// A private daemon runs in its caller's mode: a session daemon for a non-root caller (the
// launcher), a system daemon in a private mount namespace for root, or for a root caller that
// names a user (tests and benchmarks that stand in for launchers, daemons side by side on one
// machine) that user's session daemon in a private mount namespace. Programs that start one as
// root must call MaybeRunLibvirtdShim first thing in main (or TestMain).
package domain
