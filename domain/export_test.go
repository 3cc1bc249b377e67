package domain

import "libvirt.org/go/libvirt"

// The package's test helpers, for its external tests: migration_test.go is one because it
// needs test/migrationpair, which imports this package.
var (
	GuestVMI     = guestVMI
	GuestContext = guestContext
	ReadFile     = readFile
)

// QEMUVersion is the version of the QEMU c's daemon drives, in libvirt's encoding.
func QEMUVersion(c *Conn) (uint32, error) { return c.virt.GetVersion() }

// CapPostCopy caps the post-copy phase of the named domain's migration, which lifeboat leaves
// uncapped, so that a test can act while it runs.
func CapPostCopy(c *Conn, name string, bytesPerSecond uint64) error {
	dom, err := c.lookup(name)
	if err != nil {
		return err
	}
	defer dom.Free()
	return dom.MigrateSetMaxSpeed(bandwidthMiB(bytesPerSecond), libvirt.MIGRATE_MAX_SPEED_POSTCOPY)
}
