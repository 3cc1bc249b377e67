package domain

import "fmt"

// Acceleration says how guests run: with KVM, in QEMU's TCG emulator, or with KVM if a
// probe boot proves it works (nested KVM can run a BIOS yet hang a Linux kernel).
type Acceleration string

const (
	KVM  Acceleration = "kvm"
	TCG  Acceleration = "tcg"
	Auto Acceleration = "auto"
)

// ParseAcceleration reads an Acceleration from a flag or configuration value.
func ParseAcceleration(s string) (Acceleration, error) {
	switch a := Acceleration(s); a {
	case KVM, TCG, Auto:
		return a, nil
	}
	return "", fmt.Errorf("acceleration %q: want %s, %s or %s", s, KVM, TCG, Auto)
}

// domainType is libvirt's domain type for an acceleration that has been resolved.
func domainType(a Acceleration) (string, error) {
	switch a {
	case KVM:
		return "kvm", nil
	case TCG:
		return "qemu", nil
	case Auto:
		return "", fmt.Errorf("acceleration %s must be resolved (ResolveAcceleration) before domain XML is written", Auto)
	}
	return "", fmt.Errorf("unknown acceleration %q", a)
}
