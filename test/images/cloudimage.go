package images

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/lifeboat-vm/lifeboat/test/internal/cache"
)

// A Debian 12 cloud image as a containerDisk: what a user brings. It is made here from Debian's
// own packages (cloud-init, the cloud kernel, GRUB), as Debian's genericcloud image is, because
// cloud.debian.org cannot be reached from these machines while Debian's package mirror can.
// It boots through the firmware (SeaBIOS, GRUB on the disk), not a kernel lifeboat gives it, and
// configures itself with cloud-init from the VMI's NoCloud seed.
const (
	CloudImage     = Registry + "debian-cloud:" + Tag
	CloudImagePath = "/disk/debian-12-cloud.qcow2"
	// cloudRootLabel is the root file system's label, which GRUB's kernel line and fstab name.
	cloudRootLabel = "cloudimg-rootfs"
	cloudDiskSize  = 2 << 30
	// partitionStart is where the root partition starts, in 512-byte sectors: after the first
	// MiB, which holds the MBR and GRUB's core image.
	partitionStart = 2048
	// cloudCoreImage is GRUB's core image in the image's root, made by its grub-mkimage: the disk
	// and file system drivers to find /boot/grub on the first partition, where the rest is.
	cloudCoreImage = "/boot/grub/core.img"
)

// cloudPackages are a Debian cloud image's essentials: systemd, the cloud kernel, cloud-init and
// the BIOS boot loader.
var cloudPackages = []string{"systemd-sysv", "udev", "linux-image-cloud-amd64", "cloud-init", "grub-pc-bin", "grub2-common", "e2fsprogs"}

// cloudGrubConfig boots the kernel the package installed (Debian keeps /vmlinuz and /initrd.img
// pointing at it) with the console on the serial port, where the VM's console log is.
const cloudGrubConfig = `set timeout=0
linux /vmlinuz root=LABEL=` + cloudRootLabel + ` ro console=ttyS0
initrd /initrd.img
boot
`

func cloudMmdebstrapArgs(out string) []string {
	return []string{
		"--variant=minbase",
		"--format=directory",
		"--include=" + strings.Join(cloudPackages, ","),
		"--dpkgopt=path-exclude=/usr/share/man/*",
		"--dpkgopt=path-exclude=/usr/share/locale/*",
		"--dpkgopt=path-exclude=/usr/share/doc/*",
		`--customize-hook=echo "LABEL=` + cloudRootLabel + ` / ext4 defaults 0 1" > "$1"/etc/fstab`,
		`--customize-hook=mkdir -p "$1"/boot/grub && printf '%s' '` + cloudGrubConfig + `' > "$1"/boot/grub/grub.cfg`,
		// What grub-install would do, without a disk device: GRUB's modules beside grub.cfg, and
		// a core image that loads them from the first partition.
		`--customize-hook=cp -r "$1"/usr/lib/grub/i386-pc "$1"/boot/grub/`,
		`--customize-hook=chroot "$1" grub-mkimage -O i386-pc -o ` + cloudCoreImage + ` -p "(hd0,msdos1)/boot/grub" biosdisk part_msdos ext2`,
		`--customize-hook=echo debian > "$1"/etc/hostname`,
		`--customize-hook=rm -rf "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/* "$1"/var/log/*`,
		suite, out, mirror, securitySource,
	}
}

// CloudImages is the cloud image as a containerDisk image, by name.
func CloudImages(ctx context.Context, progress io.Writer) (map[string]v1.Image, error) {
	path, err := DebianCloudDisk(ctx, progress)
	if err != nil {
		return nil, err
	}
	disk, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	layer, err := FileLayer(map[string][]byte{CloudImagePath: disk}, 0o644)
	if err != nil {
		return nil, err
	}
	img, err := NewImage(v1.Config{}, layer)
	if err != nil {
		return nil, err
	}
	return map[string]v1.Image{CloudImage: img}, nil
}

// DebianCloudDisk returns the path of the cloud image's qcow2 disk, building it the first time
// (a few minutes, about 200 MB of packages, as root), then from the cache.
func DebianCloudDisk(ctx context.Context, progress io.Writer) (string, error) {
	dir, err := cache.Dir()
	if err != nil {
		return "", err
	}
	dir = filepath.Join(dir, "images")
	sum := sha256.Sum256([]byte(strings.Join(cloudMmdebstrapArgs(""), "\n")))
	path := filepath.Join(dir, "debian-"+suite+"-cloud-"+hex.EncodeToString(sum[:6])+".qcow2")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	unlock, err := cache.Lock(filepath.Join(dir, "debian-cloud.lock"))
	if err != nil {
		return "", err
	}
	defer unlock()
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	work, err := os.MkdirTemp(dir, "cloud-build-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(work)
	fmt.Fprintf(progress, "building a Debian %s cloud image (%s) into %s\n", suite, strings.Join(cloudPackages, " "), path)
	root := filepath.Join(work, "root")
	if err := run(ctx, progress, "mmdebstrap", cloudMmdebstrapArgs(root)...); err != nil {
		return "", err
	}
	raw := filepath.Join(work, "disk.raw")
	if err := assembleDisk(ctx, progress, root, raw); err != nil {
		return "", err
	}
	tmp := path + ".tmp"
	if err := run(ctx, progress, "qemu-img", "convert", "-c", "-O", "qcow2", raw, tmp); err != nil {
		_ = os.Remove(tmp)
		return "", err
	}
	return path, os.Rename(tmp, path)
}

// assembleDisk writes a BIOS-bootable disk at raw without loop devices or mounts: an ext4 file
// system of root from partitionStart on (mke2fs writes it into the file at that offset), a DOS
// partition table naming it, and GRUB as grub-install would leave it: the MBR's boot code from
// GRUB's boot.img, and the core image root's grub-mkimage made right after the MBR, where boot.img
// looks for it (sector 1) and GRUB keeps it on DOS-partitioned disks.
func assembleDisk(ctx context.Context, progress io.Writer, root, raw string) error {
	boot, err := os.ReadFile(filepath.Join(root, "usr/lib/grub/i386-pc/boot.img"))
	if err != nil {
		return err
	}
	core, err := os.ReadFile(filepath.Join(root, cloudCoreImage))
	if err != nil {
		return err
	}
	if len(boot) != 512 || len(core) > (partitionStart-1)*512 {
		return fmt.Errorf("GRUB's boot.img is %d bytes (want 512) and its core image %d (at most %d)", len(boot), len(core), (partitionStart-1)*512)
	}
	if err := os.WriteFile(raw, nil, 0o644); err != nil {
		return err
	}
	fsSize := (cloudDiskSize - partitionStart*512) / 1024
	if err := run(ctx, progress, "mkfs.ext4", "-q", "-F", "-L", cloudRootLabel, "-d", root, "-E", fmt.Sprintf("offset=%d", partitionStart*512), raw, fmt.Sprintf("%dk", fsSize)); err != nil {
		return err
	}
	f, err := os.OpenFile(raw, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Truncate(cloudDiskSize); err != nil {
		return err
	}
	mbr := make([]byte, 512)
	copy(mbr, boot[:446])
	entry := mbr[446:462]
	entry[0] = 0x80 // bootable
	entry[4] = 0x83 // Linux
	binary.LittleEndian.PutUint32(entry[8:], partitionStart)
	binary.LittleEndian.PutUint32(entry[12:], uint32(cloudDiskSize/512-partitionStart))
	mbr[510], mbr[511] = 0x55, 0xaa
	if _, err := f.WriteAt(mbr, 0); err != nil {
		return err
	}
	if _, err := f.WriteAt(core, 512); err != nil {
		return err
	}
	return f.Close()
}

// run runs a build step with its output to progress and timestamps fixed (SOURCE_DATE_EPOCH).
func run(ctx context.Context, progress io.Writer, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), "SOURCE_DATE_EPOCH="+sourceDateEpoch)
	cmd.Stdout, cmd.Stderr = progress, progress
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}
