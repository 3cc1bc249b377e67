package domain

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"libvirt.org/go/libvirtxml"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

func vmi(mutate func(*v1alpha1.VirtualMachineInstance)) *v1alpha1.VirtualMachineInstance {
	v := &v1alpha1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Namespace: "tenant", Name: "web", UID: "8d7f4c1e-2b3a-4e5f-9a6b-7c8d9e0f1a2b"},
		Spec: v1alpha1.VirtualMachineInstanceSpec{
			CPUs:   2,
			Memory: resource.MustParse("256Mi"),
			Boot:   v1alpha1.BootSource{Kernel: "/images/vmlinuz", Initrd: "/images/initrd.gz", Cmdline: "console=ttyS0 quiet"},
		},
	}
	if mutate != nil {
		mutate(v)
	}
	return v
}

func TestDomainXMLGolden(t *testing.T) {
	tests := []struct {
		golden string
		vmi    *v1alpha1.VirtualMachineInstance
		opts   XMLOptions
	}{
		{
			golden: "kernel-tcg.xml",
			vmi:    vmi(nil),
			opts:   XMLOptions{Acceleration: TCG, ConsoleLog: "/var/log/lifeboat/web.console"},
		},
		{
			golden: "disk-qcow2-kvm.xml",
			vmi: vmi(func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.CPUs = 0 // defaults to one
				v.Spec.Memory = resource.MustParse("1Gi")
				v.Spec.Boot = v1alpha1.BootSource{Disk: "/images/disk.qcow2"}
			}),
			opts: XMLOptions{Acceleration: KVM, ConsoleLog: "/var/log/lifeboat/web.console"},
		},
		{
			golden: "kernel-and-raw-disk-kvm.xml",
			vmi: vmi(func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Memory = resource.MustParse("1000M") // not a whole number of MiB
				v.Spec.Boot.Disk = "/images/root.img"
			}),
			opts: XMLOptions{Acceleration: KVM, ConsoleLog: "/var/log/lifeboat/web.console", DiskFormat: "raw"},
		},
		{
			// A containerDisk's overlay boots (no kernel), a SATA data disk, a read-only seed, a
			// ReadWriteMany claim's disk (shareable, uncached), a Block claim's device.
			golden: "disks-tcg.xml",
			vmi:    vmi(func(v *v1alpha1.VirtualMachineInstance) { v.Spec.Boot = v1alpha1.BootSource{} }),
			opts: XMLOptions{Acceleration: TCG, ConsoleLog: "/var/log/lifeboat/web.console", Disks: []Disk{
				{Path: "/var/run/lifeboat-vm/state/root.qcow2", Format: "qcow2"},
				{Path: "/var/run/lifeboat-vm/state/data.qcow2", Format: "qcow2", Bus: v1alpha1.DiskBusSATA},
				{Path: "/var/run/lifeboat-vm/state/cloudinit.iso", Format: "raw", Bus: v1alpha1.DiskBusVirtio, ReadOnly: true},
				{Path: "/var/run/lifeboat-vm/claims/shared/disk.img", Format: "raw", Shared: true},
				{Path: "/var/run/lifeboat-vm/claim-devices/raw", Format: "raw", Block: true, Shared: true},
			}},
		},
		{
			// The kernel and initrd the launcher found in boot.container's image.
			golden: "kernel-image-tcg.xml",
			vmi: vmi(func(v *v1alpha1.VirtualMachineInstance) {
				v.Spec.Boot = v1alpha1.BootSource{Container: &v1alpha1.KernelBootContainer{Image: "example.org/k", KernelPath: "/boot/vmlinuz"}, Cmdline: "console=ttyS0"}
			}),
			// As the launcher writes it: the console on a socket, logged to a file.
			opts: XMLOptions{Acceleration: TCG, ConsoleLog: "/var/run/lifeboat-vm/run/console.log", ConsoleSocket: "/var/run/lifeboat-vm/run/console.sock",
				Kernel: "/var/run/lifeboat-vm/kernel-boot/boot/vmlinuz", Initrd: "/var/run/lifeboat-vm/kernel-boot/boot/initrd.img"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.golden, func(t *testing.T) {
			got, err := DomainXML(tt.vmi, tt.opts)
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join("testdata", tt.golden)
			if *update {
				if err := os.WriteFile(path, []byte(got+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run go test ./domain -run TestDomainXMLGolden -update to write it)", err)
			}
			if got+"\n" != string(want) {
				t.Errorf("DomainXML() differs from %s (rerun with -update and review the diff):\n%s", path, got)
			}
			// libvirtxml must read back what it wrote: the XML is well formed and complete.
			var dom libvirtxml.Domain
			if err := dom.Unmarshal(got); err != nil {
				t.Fatalf("DomainXML() does not parse back: %v", err)
			}
			m, err := parseMetadata(dom.Metadata.XML)
			if err != nil {
				t.Fatal(err)
			}
			if m.Namespace != tt.vmi.Namespace || m.Name != tt.vmi.Name || m.UID != string(tt.vmi.UID) {
				t.Errorf("metadata = %+v, want the VMI %s/%s %s", m, tt.vmi.Namespace, tt.vmi.Name, tt.vmi.UID)
			}
		})
	}
}

func TestDomainXMLRejects(t *testing.T) {
	opts := XMLOptions{Acceleration: TCG, ConsoleLog: "/c.log"}
	tests := []struct {
		name string
		vmi  *v1alpha1.VirtualMachineInstance
		opts XMLOptions
		want string
	}{
		{name: "no VMI", vmi: nil, opts: opts, want: "no VMI"},
		{name: "unresolved acceleration", vmi: vmi(nil), opts: XMLOptions{Acceleration: Auto, ConsoleLog: "/c.log"}, want: "resolved"},
		{name: "UID that is no UUID", vmi: vmi(func(v *v1alpha1.VirtualMachineInstance) { v.UID = "web-1" }), opts: opts, want: "UUID"},
		{name: "no UID", vmi: vmi(func(v *v1alpha1.VirtualMachineInstance) { v.UID = "" }), opts: opts, want: "UUID"},
		{name: "nothing to boot", vmi: vmi(func(v *v1alpha1.VirtualMachineInstance) { v.Spec.Boot = v1alpha1.BootSource{} }), opts: opts, want: "boots nothing"},
		{name: "no memory", vmi: vmi(func(v *v1alpha1.VirtualMachineInstance) { v.Spec.Memory = resource.Quantity{} }), opts: opts, want: "memory"},
		{name: "fractional bytes", vmi: vmi(func(v *v1alpha1.VirtualMachineInstance) { v.Spec.Memory = resource.MustParse("100m") }), opts: opts, want: "memory"},
		{name: "no console log", vmi: vmi(nil), opts: XMLOptions{Acceleration: TCG}, want: "console"},
		{name: "unknown disk format", vmi: vmi(func(v *v1alpha1.VirtualMachineInstance) { v.Spec.Boot.Disk = "/d.vmdk" }),
			opts: XMLOptions{Acceleration: TCG, ConsoleLog: "/c.log", DiskFormat: "vmdk"}, want: "disk format"},
		{name: "a prepared disk of an unknown format", vmi: vmi(nil),
			opts: XMLOptions{Acceleration: TCG, ConsoleLog: "/c.log", Disks: []Disk{{Path: "/d", Format: "vmdk"}}}, want: `format "vmdk"`},
		{name: "a prepared disk on an unknown bus", vmi: vmi(nil),
			opts: XMLOptions{Acceleration: TCG, ConsoleLog: "/c.log", Disks: []Disk{{Path: "/d", Format: "raw", Bus: "scsi"}}}, want: `bus "scsi"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := DomainXML(tt.vmi, tt.opts)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("DomainXML() error = %v, want one mentioning %q", err, tt.want)
			}
		})
	}
}

func TestDiskFormat(t *testing.T) {
	tests := []struct {
		path, explicit string
		want           string
		wantErr        bool
	}{
		{path: "/d/root.qcow2", want: "qcow2"},
		{path: "/d/ROOT.QCOW2", want: "qcow2"},
		{path: "/d/root.img", want: "raw"},
		{path: "/d/root", want: "raw"},
		{path: "/d/root.img", explicit: "qcow2", want: "qcow2"},
		{path: "/d/root.qcow2", explicit: "raw", want: "raw"},
		{path: "/d/root.vmdk", explicit: "vmdk", wantErr: true},
	}
	for _, tt := range tests {
		got, err := diskFormat(tt.path, tt.explicit)
		if got != tt.want || (err != nil) != tt.wantErr {
			t.Errorf("diskFormat(%q, %q) = %q, %v, want %q, error %v", tt.path, tt.explicit, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestDomainName(t *testing.T) {
	if got := DomainName("tenant", "web"); got != "tenant_web" {
		t.Errorf("DomainName() = %q, want tenant_web", got)
	}
}

// A card on the pod network is a virtio NIC on the agent's tap, which libvirt opens and never
// changes (managed='no'), with the VMI's MAC and the pod's MTU.
func TestDomainXMLInterface(t *testing.T) {
	xml, err := DomainXML(vmi(nil), XMLOptions{Acceleration: TCG, ConsoleLog: "/c.log",
		Interface: &Interface{Tap: "lb-tap0", MAC: "02:11:22:33:44:55", MTU: 1450}})
	if err != nil {
		t.Fatal(err)
	}
	var dom libvirtxml.Domain
	if err := dom.Unmarshal(xml); err != nil {
		t.Fatal(err)
	}
	if len(dom.Devices.Interfaces) != 1 {
		t.Fatalf("want one interface:\n%s", xml)
	}
	i := dom.Devices.Interfaces[0]
	if i.Source == nil || i.Source.Ethernet == nil || i.Target == nil || i.Target.Dev != "lb-tap0" || i.Target.Managed != "no" ||
		i.MAC == nil || i.MAC.Address != "02:11:22:33:44:55" || i.Model == nil || i.Model.Type != "virtio" || i.MTU == nil || i.MTU.Size != 1450 {
		t.Errorf("interface %+v: want an unmanaged ethernet tap lb-tap0, virtio, MAC 02:11:22:33:44:55, MTU 1450:\n%s", i, xml)
	}
	if none, err := DomainXML(vmi(nil), XMLOptions{Acceleration: TCG, ConsoleLog: "/c.log"}); err != nil || strings.Contains(none, "<interface") {
		t.Errorf("a VMI without a card got one (err %v):\n%s", err, none)
	}
}
