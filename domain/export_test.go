package domain

// The package's test helpers, for its external tests: migration_test.go is one because it
// needs test/migrationpair, which imports this package.
var (
	GuestVMI     = guestVMI
	GuestContext = guestContext
	ReadFile     = readFile
)

// QEMUVersion is the version of the QEMU c's daemon drives, in libvirt's encoding.
func QEMUVersion(c *Conn) (uint32, error) { return c.virt.GetVersion() }
