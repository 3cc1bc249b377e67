package vmdisks

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	diskfs "github.com/diskfs/go-diskfs"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/domain"
)

func write(t *testing.T, path, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestInImageResolvesSymlinksInsideTheImage(t *testing.T) {
	outside := t.TempDir()
	write(t, filepath.Join(outside, "secret"), "the node's")
	root := t.TempDir()
	write(t, filepath.Join(root, "boot/vmlinuz-6.1"), "kernel")
	write(t, filepath.Join(root, "secret"), "the image's")
	for _, l := range []struct{ name, target string }{
		{"boot/vmlinuz", "vmlinuz-6.1"},
		{"vmlinuz", "/boot/vmlinuz-6.1"},
		{"absolute-out", filepath.Join(outside, "secret")},
		{"relative-out", "../../../../../../.." + filepath.Join(outside, "secret")},
	} {
		if err := os.Symlink(l.target, filepath.Join(root, l.name)); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct{ path, want, err string }{
		{path: "/boot/vmlinuz", want: "kernel"},
		{path: "/vmlinuz", want: "kernel"},
		{path: "/../../boot/vmlinuz-6.1", want: "kernel"},
		{path: "/absolute-out", err: "no such file"},
		{path: "/relative-out", err: "no such file"},
		{path: "/boot", err: "not a regular file"},
		{path: "/missing", err: "no such file"},
	} {
		got, err := InImage(root, tc.path)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("InImage(%q) = %q, %v; want an error with %q", tc.path, got, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("InImage(%q): %v", tc.path, err)
			continue
		}
		data, _ := os.ReadFile(got)
		if !strings.HasPrefix(got, root+"/") || string(data) != tc.want {
			t.Errorf("InImage(%q) = %q holding %q; want a file under the image holding %q", tc.path, got, data, tc.want)
		}
	}
}

func TestContainerDiskImageIsTheOneFileInDisk(t *testing.T) {
	one := t.TempDir()
	write(t, filepath.Join(one, "disk/fedora.qcow2"), "image")
	two := t.TempDir()
	write(t, filepath.Join(two, "disk/a.img"), "a")
	write(t, filepath.Join(two, "disk/b.img"), "b")
	none := t.TempDir()

	if got, err := containerDiskImage(one, ""); err != nil || got != filepath.Join(one, "disk/fedora.qcow2") {
		t.Errorf("one file in /disk: %q, %v; want it", got, err)
	}
	if got, err := containerDiskImage(two, "/disk/b.img"); err != nil || got != filepath.Join(two, "disk/b.img") {
		t.Errorf("an explicit path: %q, %v; want it", got, err)
	}
	if _, err := containerDiskImage(two, ""); err == nil || !strings.Contains(err.Error(), "holds 2 files") {
		t.Errorf("two files in /disk and no path: %v; want an error naming both", err)
	}
	if _, err := containerDiskImage(none, ""); err == nil || !strings.Contains(err.Error(), "no /disk directory") {
		t.Errorf("no /disk: %v; want an error saying so", err)
	}
}

func requireQemuImg(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("qemu-img"); err != nil {
		t.Fatalf("qemu-img is missing (make deps installs qemu-utils): %v", err)
	}
}

func TestOverlayLeavesTheImageUntouchedAndRefusesBackingFiles(t *testing.T) {
	requireQemuImg(t)
	ctx := context.Background()
	dir := t.TempDir()
	base := filepath.Join(dir, "base.qcow2")
	if _, err := qemuImg(ctx, "create", "-q", "-f", "qcow2", base, "16M"); err != nil {
		t.Fatal(err)
	}
	overlay := filepath.Join(dir, "state", "root.qcow2")
	if err := os.MkdirAll(filepath.Dir(overlay), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := writeOverlay(ctx, base, overlay); err != nil {
		t.Fatalf("an overlay on a self-contained qcow2 image: %v", err)
	}
	out, err := qemuImg(ctx, "info", "--output=json", overlay)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), `"backing-filename": "`+base+`"`) || !strings.Contains(string(out), `"backing-filename-format": "qcow2"`) {
		t.Errorf("the overlay's info: %s; want the image as its qcow2 backing file", out)
	}

	chained := filepath.Join(dir, "chained.qcow2")
	if _, err := qemuImg(ctx, "create", "-q", "-f", "qcow2", "-b", "/etc/shadow", "-F", "raw", chained, "16M"); err != nil {
		t.Fatal(err)
	}
	err = writeOverlay(ctx, chained, filepath.Join(dir, "state", "evil.qcow2"))
	if err == nil || !strings.Contains(err.Error(), `names a backing file ("/etc/shadow")`) {
		t.Errorf("an image naming a backing file: %v; want it refused, naming the file", err)
	}
	if _, statErr := os.Stat(filepath.Join(dir, "state", "evil.qcow2")); statErr == nil {
		t.Error("an overlay was written on the refused image")
	}

	// An external data file, as an image author would point it at the launcher's cloud-init
	// Secret; refused before qemu-img opens it, so whether it exists does not matter.
	secret := filepath.Join(dir, "secrets", "seed", "userdata")
	if err := os.MkdirAll(filepath.Dir(secret), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, dataFileRaw := range []string{"off", "on"} {
		external := filepath.Join(dir, "external-"+dataFileRaw+".qcow2")
		if _, err := qemuImg(ctx, "create", "-q", "-f", "qcow2", "-o", "data_file="+secret+",data_file_raw="+dataFileRaw, external, "16M"); err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(secret); err != nil {
			t.Fatal(err)
		}
		err = writeOverlay(ctx, external, filepath.Join(dir, "state", "external.qcow2"))
		if err == nil || !strings.Contains(err.Error(), `keeps its data in an external file ("`+secret+`")`) {
			t.Errorf("an image with an external data file (data_file_raw=%s): %v; want it refused, naming the file", dataFileRaw, err)
		}
		if _, statErr := os.Stat(filepath.Join(dir, "state", "external.qcow2")); statErr == nil {
			t.Error("an overlay was written on the refused image")
		}
	}
}

// Images too short or not qcow2 version 3 have no external data file; a header cut short in its
// extensions is still refused for the feature bit.
func TestQCOW2DataFileReadsOnlyTheHeader(t *testing.T) {
	dir := t.TempDir()
	v3 := func(incompat uint64, ext []byte) []byte {
		h := make([]byte, 112)
		copy(h, qcow2Magic)
		binary.BigEndian.PutUint32(h[4:], 3)
		binary.BigEndian.PutUint64(h[qcow2IncompatOffset:], incompat)
		binary.BigEndian.PutUint32(h[qcow2HeaderLenOffset:], 112)
		return append(h, ext...)
	}
	named := binary.BigEndian.AppendUint32(nil, qcow2ExtDataFile)
	named = binary.BigEndian.AppendUint32(named, 5)
	named = append(named, "/x/yz\x00\x00\x00"...)
	for _, tc := range []struct {
		name   string
		header []byte
		want   *string
	}{
		{"empty", nil, nil},
		{"raw", bytes.Repeat([]byte{0xeb}, 4096), nil},
		{"qcow2 version 2", append([]byte(qcow2Magic), 0, 0, 0, 2), nil},
		{"qcow2 version 3, self-contained", v3(0, nil), nil},
		{"qcow2 version 3, data file named", v3(qcow2IncompatDataFile, named), ptr.To("/x/yz")},
		{"qcow2 version 3, data file bit, extension cut short", v3(qcow2IncompatDataFile, named[:10]), ptr.To("")},
	} {
		image := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-"))
		if err := os.WriteFile(image, tc.header, 0o644); err != nil {
			t.Fatal(err)
		}
		got, err := qcow2DataFile(image)
		if err != nil || (got == nil) != (tc.want == nil) || (got != nil && *got != *tc.want) {
			t.Errorf("%s: data file %v (%v), want %v", tc.name, ptr.Deref(got, "<none>"), err, ptr.Deref(tc.want, "<none>"))
		}
	}
}

func TestNoCloudSeedHoldsTheDataUnderCloudInitsNames(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cloudinit.iso")
	src := v1alpha1.CloudInitNoCloudSource{UserData: "#cloud-config\npassword: x\n", NetworkData: "version: 2\n"}
	if err := WriteNoCloudSeed(path, src, Identity{UID: "1234", Name: "demo"}); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// The primary volume descriptor is at sector 16; its volume identifier at byte 40, padded
	// (with NULs here, which blkid ends the label at as it does at spaces).
	if label := strings.TrimRight(string(raw[16*2048+40:16*2048+72]), " \x00"); !strings.EqualFold(label, NoCloudLabel) {
		t.Errorf("volume label %q, want %q (cloud-init finds its seed by it)", label, NoCloudLabel)
	}
	d, err := diskfs.Open(path, diskfs.WithOpenMode(diskfs.ReadOnly))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	fsys, err := d.GetFilesystem(0)
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{
		"meta-data":      "instance-id: 1234\nlocal-hostname: demo\n",
		"user-data":      src.UserData,
		"network-config": src.NetworkData,
	} {
		f, err := fsys.OpenFile("/"+name, os.O_RDONLY)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		got, err := io.ReadAll(f)
		if err != nil || string(got) != want {
			t.Errorf("%s holds %q (%v), want %q", name, got, err, want)
		}
	}
}

func TestClaimDiskFillsTheClaimAndKeepsAnExistingOne(t *testing.T) {
	dir := t.TempDir()
	disk := filepath.Join(dir, "disk.img")
	if err := ensureClaimDisk(disk, 100<<20); err != nil {
		t.Fatal(err)
	}
	info, err := os.Stat(disk)
	if err != nil {
		t.Fatal(err)
	}
	if want := int64(94 << 20); info.Size() != want {
		t.Errorf("disk.img on a 100 MiB claim is %d bytes, want %d (less 5.5%%, whole MiB)", info.Size(), want)
	}
	write(t, disk, "the user's data")
	if err := ensureClaimDisk(disk, 100<<20); err != nil {
		t.Fatal(err)
	}
	if data, _ := os.ReadFile(disk); string(data) != "the user's data" {
		t.Errorf("an existing disk.img was changed: %q", data)
	}

	planted := filepath.Join(t.TempDir(), "disk.img")
	if err := os.Symlink("/var/run/lifeboat/notify.sock", planted); err != nil {
		t.Fatal(err)
	}
	if err := ensureClaimDisk(planted, 100<<20); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("a disk.img planted as a symlink: %v; want it refused", err)
	}
}

func TestSecretUserDataTakesKubeVirtsKeys(t *testing.T) {
	lower, camel, none := t.TempDir(), t.TempDir(), t.TempDir()
	write(t, filepath.Join(lower, "userdata"), "#cloud-config lower")
	write(t, filepath.Join(camel, "userData"), "#cloud-config camel")
	write(t, filepath.Join(none, "password"), "x")
	for dir, want := range map[string]string{lower: "#cloud-config lower", camel: "#cloud-config camel"} {
		if got, err := secretUserData(dir); err != nil || got != want {
			t.Errorf("secretUserData = %q, %v; want %q", got, err, want)
		}
	}
	if _, err := secretUserData(none); err == nil || !strings.Contains(err.Error(), `none of the keys ["userdata" "userData"]`) {
		t.Errorf("a Secret without the key: %v, want an error naming the keys", err)
	}
}

// TestABlockClaimIsTheDeviceTheKubeletGave: a Block claim's disk is the device at its path, raw
// and shared when ReadWriteMany; anything but a block device there is refused.
func TestABlockClaimIsTheDeviceTheKubeletGave(t *testing.T) {
	if os.Getuid() != 0 {
		t.Fatal("making a device node needs root (the README's prerequisites)")
	}
	block := corev1.PersistentVolumeBlock
	spec := v1alpha1.VirtualMachineInstanceSpec{
		Disks:   []v1alpha1.Disk{{Name: "raw"}},
		Volumes: []v1alpha1.Volume{{Name: "raw", PersistentVolumeClaim: &v1alpha1.PersistentVolumeClaimSource{ClaimName: "c"}}},
	}
	claims := []v1alpha1.VolumeStatus{{Name: "raw", PersistentVolumeClaimInfo: &v1alpha1.PersistentVolumeClaimInfo{
		ClaimName: "c", VolumeMode: &block, AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany}}}}
	dirs := Dirs{ClaimDevices: t.TempDir()}
	device := filepath.Join(dirs.ClaimDevices, "raw")
	// The first loop device's numbers (7, 0); the node is never opened here.
	if err := unix.Mknod(device, unix.S_IFBLK|0o600, int(unix.Mkdev(7, 0))); err != nil {
		t.Fatal(err)
	}
	got, err := Prepare(t.Context(), spec, claims, Identity{}, dirs)
	if err != nil {
		t.Fatal(err)
	}
	if want := []domain.Disk{{Path: device, Format: "raw", Block: true, Shared: true}}; !reflect.DeepEqual(got.Disks, want) {
		t.Errorf("disks = %+v, want %+v", got.Disks, want)
	}

	dirs.ClaimDevices = t.TempDir()
	write(t, filepath.Join(dirs.ClaimDevices, "raw"), "a file, not a device")
	if _, err := Prepare(t.Context(), spec, claims, Identity{}, dirs); err == nil || !strings.Contains(err.Error(), "is not a block device") {
		t.Errorf("a file where the device should be: %v; want it refused", err)
	}
}
