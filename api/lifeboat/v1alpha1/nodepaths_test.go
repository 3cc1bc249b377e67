package v1alpha1

import (
	"strings"
	"testing"
)

func TestRefusedNodePath(t *testing.T) {
	guest := []string{"/var/lib/lifeboat/guest"}
	for _, tc := range []struct {
		name    string
		boot    BootSource
		allowed []string
		refuse  string // a part of the refusal; "" means allowed
	}{
		{"a kernel and initrd in an allowed directory", BootSource{Kernel: "/var/lib/lifeboat/guest/vmlinuz", Initrd: "/var/lib/lifeboat/guest/initrd.gz"}, guest, ""},
		{"a file in a directory below an allowed one", BootSource{Disk: "/var/lib/lifeboat/guest/disks/a.qcow2"}, guest, ""},
		{"any path when none is allowed", BootSource{Kernel: "/var/lib/lifeboat/guest/vmlinuz"}, nil, "allows none"},
		{"/etc/shadow", BootSource{Kernel: "/etc/shadow"}, guest, `boot.kernel "/etc/shadow" is not`},
		{"a node's block device as a disk", BootSource{Kernel: "/var/lib/lifeboat/guest/vmlinuz", Disk: "/dev/sda"}, guest, `boot.disk "/dev/sda"`},
		{"the kubelet's directory", BootSource{Initrd: "/var/lib/kubelet", Kernel: "/var/lib/lifeboat/guest/vmlinuz"}, guest, `boot.initrd "/var/lib/kubelet"`},
		{"a .. out of an allowed directory", BootSource{Kernel: "/var/lib/lifeboat/guest/../../../../etc/shadow"}, guest, "not a clean path"},
		{"the allowed directory itself", BootSource{Disk: "/var/lib/lifeboat/guest"}, guest, "boot.disk"},
		{"a sibling sharing the prefix", BootSource{Kernel: "/var/lib/lifeboat/guest-other/vmlinuz"}, guest, "boot.kernel"},
		{"a relative path", BootSource{Kernel: "vmlinuz"}, guest, "boot.kernel"},
		{"a doubled slash", BootSource{Kernel: "/var/lib/lifeboat/guest//vmlinuz"}, guest, "boot.kernel"},
		{"/ never allows everything", BootSource{Kernel: "/etc/shadow"}, []string{"/"}, "boot.kernel"},
		{"no node path at all", BootSource{}, nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := RefusedNodePath(tc.boot, tc.allowed)
			switch {
			case tc.refuse == "" && got != "":
				t.Errorf("refused: %s", got)
			case tc.refuse != "" && !strings.Contains(got, tc.refuse):
				t.Errorf("got %q, want a refusal containing %q", got, tc.refuse)
			case tc.refuse != "" && len(tc.allowed) > 0 && !strings.Contains(got, strings.Join(tc.allowed, ", ")):
				t.Errorf("the refusal %q should name the allowed directories", got)
			}
		})
	}
}
