package domain

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/google/uuid"
	"libvirt.org/go/libvirtxml"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

// XMLOptions are the node-side choices DomainXML needs besides the VMI.
type XMLOptions struct {
	// Acceleration is KVM or TCG; resolve Auto with ResolveAcceleration first.
	Acceleration Acceleration
	// ConsoleLog is the file the guest's serial console is written to. The agent and
	// tests read the guest's output there.
	ConsoleLog string
	// ConsoleSocket, if set, is a unix socket QEMU listens on for the serial console (one
	// client at a time: `kubectl lifeboat console`); everything the guest prints still goes to
	// ConsoleLog too, written by QEMU itself (the launcher's libvirt has no virtlogd).
	ConsoleSocket string
	// DiskFormat is the format of spec.boot.disk, "qcow2" or "raw". Empty means by the
	// file's extension: .qcow2 is qcow2, anything else raw.
	DiskFormat string
	// Kernel and Initrd are the files the guest boots, as the launcher found them (in
	// spec.boot.container's image); empty means spec.boot.kernel's and spec.boot.initrd's.
	Kernel, Initrd string
	// Disks are spec.disks, in order, as the launcher prepared them.
	Disks []Disk
	// Interface is the guest's card on the pod network, if it has one.
	Interface *Interface
}

// Interface is a virtio network card on a tap the node's agent made in the pod.
type Interface struct {
	// Tap is the device's name; libvirt opens it and never changes it (managed='no'), so a
	// launcher without capabilities can use it, and a migration target has one of the same name.
	Tap string
	// MAC is the card's address; it travels with the domain in a migration.
	MAC string
	// MTU is the pod interface's.
	MTU uint
}

// Disk is one of the guest's disks, ready for QEMU.
type Disk struct {
	// Path is the image file QEMU opens.
	Path string
	// Format is qcow2 or raw. It is never probed from the file (see diskFormat).
	Format string
	// Bus is virtio or sata.
	Bus v1alpha1.DiskBus
	// ReadOnly disks are attached read-only: the guest cannot change them.
	ReadOnly bool
	// Shared disks are on storage both nodes of a migration reach (a ReadWriteMany claim): they
	// are attached shareable and uncached, so a migration leaves them in place and neither QEMU
	// holds writes the other cannot see.
	Shared bool
	// Block disks are a block device (a Block-mode claim), not a file.
	Block bool
}

// DomainName is the libvirt name of a VMI's domain. Kubernetes names cannot contain "_",
// so the name is unambiguous.
func DomainName(namespace, name string) string { return namespace + "_" + name }

// machineType is the QEMU machine of every domain: q35 has ACPI (for the power button)
// and is what both ends of a migration must agree on.
const machineType = "q35"

// DomainXML writes the libvirt domain of a VMI: its CPUs and memory, a direct kernel boot
// and/or a virtio disk, the serial console to a file, ACPI, no network, and lifeboat's
// metadata. The domain is destroyed (not restarted) when the guest powers off or crashes,
// since the VMI's life ends there.
func DomainXML(vmi *v1alpha1.VirtualMachineInstance, opts XMLOptions) (string, error) {
	if vmi == nil {
		return "", errors.New("writing domain XML: no VMI")
	}
	domType, err := domainType(opts.Acceleration)
	if err != nil {
		return "", err
	}
	if _, err := uuid.Parse(string(vmi.UID)); err != nil {
		return "", fmt.Errorf("VMI %s/%s: its UID %q is the domain's UUID and must be one: %w", vmi.Namespace, vmi.Name, vmi.UID, err)
	}
	memoryKiB, err := memoryKiB(vmi)
	if err != nil {
		return "", err
	}
	boot := vmi.Spec.Boot
	kernel, initrd := boot.Kernel, boot.Initrd
	if opts.Kernel != "" {
		kernel, initrd = opts.Kernel, opts.Initrd
	}
	if kernel == "" && boot.Disk == "" && len(opts.Disks) == 0 {
		return "", fmt.Errorf("VMI %s/%s boots nothing: it needs a kernel (spec.boot) or a disk", vmi.Namespace, vmi.Name)
	}
	if opts.ConsoleLog == "" {
		return "", errors.New("writing domain XML: no console log file")
	}
	metadata, err := marshalMetadata(Metadata{Namespace: vmi.Namespace, Name: vmi.Name, UID: string(vmi.UID)})
	if err != nil {
		return "", err
	}
	cpus := uint(1)
	if vmi.Spec.CPUs > 0 {
		cpus = uint(vmi.Spec.CPUs)
	}
	port := uint(0)
	dom := &libvirtxml.Domain{
		Type:     domType,
		Name:     DomainName(vmi.Namespace, vmi.Name),
		UUID:     string(vmi.UID),
		Metadata: &libvirtxml.DomainMetadata{XML: metadata},
		Memory:   &libvirtxml.DomainMemory{Value: memoryKiB, Unit: "KiB"},
		VCPU:     &libvirtxml.DomainVCPU{Value: cpus},
		OS: &libvirtxml.DomainOS{
			Type:    &libvirtxml.DomainOSType{Arch: "x86_64", Machine: machineType, Type: "hvm"},
			Kernel:  kernel,
			Initrd:  initrd,
			Cmdline: boot.Cmdline,
		},
		Features: &libvirtxml.DomainFeatureList{
			ACPI: &libvirtxml.DomainFeature{},
			APIC: &libvirtxml.DomainFeatureAPIC{},
		},
		Clock:      &libvirtxml.DomainClock{Offset: "utc"},
		OnPoweroff: "destroy",
		OnReboot:   "restart",
		OnCrash:    "destroy",
		Devices: &libvirtxml.DomainDeviceList{
			Serials: []libvirtxml.DomainSerial{serial(opts, port)},
			// No balloon: lifeboat sizes guests by their pod's memory request, and every
			// device is one more thing a migration must carry.
			MemBalloon: &libvirtxml.DomainMemBalloon{Model: "none"},
		},
	}
	if boot.Disk != "" {
		format, err := diskFormat(boot.Disk, opts.DiskFormat)
		if err != nil {
			return "", err
		}
		dom.Devices.Disks = []libvirtxml.DomainDisk{{
			Device: "disk",
			Driver: &libvirtxml.DomainDiskDriver{Name: "qemu", Type: format},
			Source: &libvirtxml.DomainDiskSource{File: &libvirtxml.DomainDiskSourceFile{File: boot.Disk}},
			Target: &libvirtxml.DomainDiskTarget{Dev: "vda", Bus: "virtio"},
		}}
	}
	if i := opts.Interface; i != nil {
		dom.Devices.Interfaces = []libvirtxml.DomainInterface{{
			Source: &libvirtxml.DomainInterfaceSource{Ethernet: &libvirtxml.DomainInterfaceSourceEthernet{}},
			Target: &libvirtxml.DomainInterfaceTarget{Dev: i.Tap, Managed: "no"},
			MAC:    &libvirtxml.DomainInterfaceMAC{Address: i.MAC},
			Model:  &libvirtxml.DomainInterfaceModel{Type: "virtio"},
			MTU:    &libvirtxml.DomainInterfaceMTU{Size: i.MTU},
		}}
	}
	if err := addDisks(dom, opts.Disks, kernel == "" && boot.Disk == ""); err != nil {
		return "", fmt.Errorf("VMI %s/%s: %w", vmi.Namespace, vmi.Name, err)
	}
	out, err := dom.Marshal()
	if err != nil {
		return "", fmt.Errorf("writing the domain XML of VMI %s/%s: %w", vmi.Namespace, vmi.Name, err)
	}
	return out, nil
}

// memoryKiB is the VMI's memory in KiB, rounded up.
func memoryKiB(vmi *v1alpha1.VirtualMachineInstance) (uint, error) {
	bytes, ok := vmi.Spec.Memory.AsInt64()
	if !ok || bytes <= 0 {
		return 0, fmt.Errorf("VMI %s/%s: memory %s is not a positive number of bytes", vmi.Namespace, vmi.Name, vmi.Spec.Memory.String())
	}
	return uint((bytes + 1023) / 1024), nil
}

// diskFormat is the format of a disk image. It is never read from the image itself:
// a guest can write a qcow2 header into a raw disk and so make the host open files of its
// choosing as backing files (the reason libvirt does not probe formats either).
func diskFormat(path, explicit string) (string, error) {
	switch explicit {
	case "qcow2", "raw":
		return explicit, nil
	case "":
		if strings.EqualFold(filepath.Ext(path), ".qcow2") {
			return "qcow2", nil
		}
		return "raw", nil
	}
	return "", fmt.Errorf("disk format %q: want qcow2 or raw", explicit)
}

// addDisks attaches disks after any boot.disk, naming each bus's devices in order (vda, vdb, …;
// sda, …). The first boots when nothing else does.
func addDisks(dom *libvirtxml.Domain, disks []Disk, bootFirst bool) error {
	next := map[v1alpha1.DiskBus]int{v1alpha1.DiskBusVirtio: len(dom.Devices.Disks)}
	prefix := map[v1alpha1.DiskBus]string{v1alpha1.DiskBusVirtio: "vd", v1alpha1.DiskBusSATA: "sd"}
	for i, d := range disks {
		bus := d.Bus
		if bus == "" {
			bus = v1alpha1.DiskBusVirtio
		}
		p, ok := prefix[bus]
		if !ok {
			return fmt.Errorf("disk %d: bus %q: want virtio or sata", i, bus)
		}
		if d.Format != "qcow2" && d.Format != "raw" {
			return fmt.Errorf("disk %d: format %q: want qcow2 or raw", i, d.Format)
		}
		if next[bus] >= 26 {
			return fmt.Errorf("disk %d: more than 26 disks on bus %s", i, bus)
		}
		disk := libvirtxml.DomainDisk{
			Device: "disk",
			Driver: &libvirtxml.DomainDiskDriver{Name: "qemu", Type: d.Format},
			Source: &libvirtxml.DomainDiskSource{File: &libvirtxml.DomainDiskSourceFile{File: d.Path}},
			Target: &libvirtxml.DomainDiskTarget{Dev: p + string(rune('a'+next[bus])), Bus: string(bus)},
		}
		if d.Block {
			disk.Source = &libvirtxml.DomainDiskSource{Block: &libvirtxml.DomainDiskSourceBlock{Dev: d.Path}}
		}
		next[bus]++
		if d.ReadOnly {
			disk.ReadOnly = &libvirtxml.DomainDiskReadOnly{}
		}
		if d.Shared {
			disk.Shareable = &libvirtxml.DomainDiskShareable{}
			disk.Driver.Cache = "none"
		}
		if bootFirst && i == 0 {
			disk.Boot = &libvirtxml.DomainDeviceBoot{Order: 1}
		}
		dom.Devices.Disks = append(dom.Devices.Disks, disk)
	}
	return nil
}

// serial is the guest's serial console: a file, or a socket whose output is logged to that file.
// QEMU appends to the file, so that the launcher may empty it when it grows too large (a file
// QEMU wrote at its own offset would grow on past the hole).
func serial(opts XMLOptions, port uint) libvirtxml.DomainSerial {
	s := libvirtxml.DomainSerial{
		Source: &libvirtxml.DomainChardevSource{File: &libvirtxml.DomainChardevSourceFile{Path: opts.ConsoleLog, Append: "on"}},
		Target: &libvirtxml.DomainSerialTarget{Port: &port},
	}
	if opts.ConsoleSocket != "" {
		s.Source = &libvirtxml.DomainChardevSource{UNIX: &libvirtxml.DomainChardevSourceUNIX{Mode: "bind", Path: opts.ConsoleSocket}}
		s.Log = &libvirtxml.DomainChardevLog{File: opts.ConsoleLog, Append: "on"}
	}
	return s
}
