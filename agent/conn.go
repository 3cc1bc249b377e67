package agent

import "context"

// DomainConn is the agent's link to one launcher's libvirt daemon and its domain.
type DomainConn interface {
	// Observe reads the domain's state and lifeboat metadata; nil while the launcher has not
	// defined its domain yet.
	Observe(ctx context.Context, domainName string) (*Domain, error)
	// Changes receives a value whenever the domain's lifecycle changes and is closed when the
	// connection to the launcher's libvirt ends.
	Changes() <-chan struct{}
	// Shutdown presses the guest's ACPI power button.
	Shutdown(ctx context.Context, domainName string) error
	// DomainNames lists the launcher's domains by name (it defines one: namespace_name of its
	// VMI); the agent reads it for a launcher whose VMI it does not know.
	DomainNames(ctx context.Context) ([]string, error)
	// Destroy stops the guest at once.
	Destroy(ctx context.Context, domainName string) error
	Close() error
}

// Dialer connects to the libvirt socket of the launcher serving the VMI with the given UID.
type Dialer func(ctx context.Context, socketPath, vmiUID string) (DomainConn, error)
