package domain

// The package's test helpers, for its external tests: migration_test.go is one because it
// needs test/migrationpair, which imports this package.
var (
	GuestVMI     = guestVMI
	GuestContext = guestContext
	ReadFile     = readFile
)
