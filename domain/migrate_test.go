package domain

import (
	"testing"

	"libvirt.org/go/libvirt"
)

func TestMigrateFlags(t *testing.T) {
	always := libvirt.MIGRATE_LIVE | libvirt.MIGRATE_PEER2PEER | libvirt.MIGRATE_PERSIST_DEST | libvirt.MIGRATE_UNDEFINE_SOURCE
	tests := []struct {
		name string
		opts MigrateOptions
		want libvirt.DomainMigrateFlags
	}{
		{name: "plain pre-copy", opts: MigrateOptions{}, want: always},
		{name: "auto-converge", opts: MigrateOptions{AutoConverge: true}, want: always | libvirt.MIGRATE_AUTO_CONVERGE},
		{name: "post-copy allowed", opts: MigrateOptions{AllowPostCopy: true}, want: always | libvirt.MIGRATE_POSTCOPY},
		{name: "both", opts: MigrateOptions{AutoConverge: true, AllowPostCopy: true}, want: always | libvirt.MIGRATE_AUTO_CONVERGE | libvirt.MIGRATE_POSTCOPY},
		// A resume is a post-copy migration's, whatever the options it started with.
		{name: "post-copy resumed", opts: MigrateOptions{PostCopyResume: true}, want: always | libvirt.MIGRATE_POSTCOPY | libvirt.MIGRATE_POSTCOPY_RESUME},
		// Only the top image (the overlay): the backing containerDisk image is on the target too.
		{name: "disks to copy", opts: MigrateOptions{DisksURI: "unix:///d/migration-nbd.sock"}, want: always | libvirt.MIGRATE_NON_SHARED_INC},
		{name: "disks to copy, writes mirrored synchronously", opts: MigrateOptions{DisksURI: "unix:///d/migration-nbd.sock", SynchronousDiskWrites: true},
			want: always | libvirt.MIGRATE_NON_SHARED_INC | libvirt.MIGRATE_NON_SHARED_SYNCHRONOUS_WRITES},
		{name: "synchronous writes without disks to copy mean nothing", opts: MigrateOptions{SynchronousDiskWrites: true}, want: always},
		// libvirt takes a local file system for unshared; a ReadWriteMany claim is shared by contract.
		{name: "disks on shared claims", opts: MigrateOptions{SharedDisks: true}, want: always | libvirt.MIGRATE_UNSAFE},
		// The destination holds the guest until the source gave it up (HandOff).
		{name: "paused on arrival", opts: MigrateOptions{PausedOnArrival: true}, want: always | libvirt.MIGRATE_PAUSED},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := migrateFlags(tt.opts)
			if got != tt.want {
				t.Errorf("migrateFlags(%+v) = %#x, want %#x", tt.opts, got, tt.want)
			}
			if got&libvirt.MIGRATE_TUNNELLED != 0 {
				t.Errorf("migrateFlags(%+v) tunnels the stream through libvirt, want it on QEMU's own socket", tt.opts)
			}
		})
	}
}

func TestBandwidthMiB(t *testing.T) {
	tests := []struct {
		name  string
		bytes uint64
		want  uint64
	}{
		{name: "no cap", bytes: 0, want: 0},
		{name: "one byte is still a cap", bytes: 1, want: 1},
		{name: "exactly 64 MiB/s", bytes: 64 << 20, want: 64},
		{name: "rounded up", bytes: 64<<20 + 1, want: 65},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := bandwidthMiB(tt.bytes); got != tt.want {
				t.Errorf("bandwidthMiB(%d) = %d, want %d", tt.bytes, got, tt.want)
			}
		})
	}
}

func TestMigrateParams(t *testing.T) {
	tests := []struct {
		name string
		opts MigrateOptions
		want libvirt.DomainMigrateParameters
	}{
		{
			name: "unix socket, no cap",
			opts: MigrateOptions{MigrateURI: "unix:///d/migration-qemu.sock"},
			want: libvirt.DomainMigrateParameters{URISet: true, URI: "unix:///d/migration-qemu.sock"},
		},
		{
			name: "tcp with a listen address and a cap",
			opts: MigrateOptions{MigrateURI: "tcp://127.0.0.12:49152", ListenAddress: "127.0.0.12", Bandwidth: 16 << 20},
			want: libvirt.DomainMigrateParameters{
				URISet: true, URI: "tcp://127.0.0.12:49152",
				ListenAddressSet: true, ListenAddress: "127.0.0.12",
				BandwidthSet: true, Bandwidth: 16,
			},
		},
		{
			name: "disks copied through a unix socket",
			opts: MigrateOptions{MigrateURI: "unix:///d/migration-qemu.sock", DisksURI: "unix:///d/migration-nbd.sock"},
			want: libvirt.DomainMigrateParameters{URISet: true, URI: "unix:///d/migration-qemu.sock", DisksURISet: true, DisksURI: "unix:///d/migration-nbd.sock"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := migrateParams(tt.opts)
			if got.URISet != tt.want.URISet || got.URI != tt.want.URI ||
				got.ListenAddressSet != tt.want.ListenAddressSet || got.ListenAddress != tt.want.ListenAddress ||
				got.BandwidthSet != tt.want.BandwidthSet || got.Bandwidth != tt.want.Bandwidth ||
				got.DisksURISet != tt.want.DisksURISet || got.DisksURI != tt.want.DisksURI {
				t.Errorf("migrateParams(%+v) = %+v, want %+v", tt.opts, *got, tt.want)
			}
		})
	}
}

func TestProxiedURIs(t *testing.T) {
	dest, mig := ProxiedURIs("/var/run/lifeboat/domains/u1", false)
	if want := "qemu+unix:///system?socket=/var/run/lifeboat/domains/u1/migration-libvirt.sock"; dest != want {
		t.Errorf("destination URI = %s, want %s", dest, want)
	}
	if want := "unix:///var/run/lifeboat/domains/u1/migration-qemu.sock"; mig != want {
		t.Errorf("migration URI = %s, want %s", mig, want)
	}
	if dest, _ := ProxiedURIs("/var/run/lifeboat/domains/u1", true); dest != "qemu+unix:///session?socket=/var/run/lifeboat/domains/u1/migration-libvirt.sock" {
		t.Errorf("destination URI of a session daemon's migration = %s, want the session driver", dest)
	}
	if got, want := ProxiedDisksURI("/var/run/lifeboat/domains/u1"), "unix:///var/run/lifeboat/domains/u1/migration-nbd.sock"; got != want {
		t.Errorf("disks URI = %s, want %s", got, want)
	}
}
