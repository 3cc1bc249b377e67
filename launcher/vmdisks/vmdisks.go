// Package vmdisks makes a VMI's disks and boot files ready for QEMU inside its launcher pod:
// it finds the kernel and disk images in the image volumes the pod mounts, writes a
// copy-on-write overlay for each containerDisk and the cloud-init seed into the pod's emptyDir.
// Everything it opens is the VM's own: a path in an image is resolved as if the image were the
// root, so a symlink in a user's image cannot lead out of it.
package vmdisks

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"

	securejoin "github.com/cyphar/filepath-securejoin"
	"golang.org/x/sys/unix"

	contract "github.com/lifeboat-vm/lifeboat/api/launcher"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/domain"
)

// Dirs are where the pod mounts the VM's volumes (api/launcher's KernelBootDir,
// ContainerDisksDir and StateDir in a launcher pod).
type Dirs struct {
	KernelBoot     string
	ContainerDisks string
	State          string
	Claims         string
	ClaimDevices   string
	Secrets        string
}

// Prepared is what the domain is built from besides the VMI's spec.
type Prepared struct {
	// Kernel and Initrd are the files the guest boots: boot.container's, found in its image, or
	// boot.kernel's and boot.initrd's.
	Kernel, Initrd string
	Disks          []domain.Disk
}

// Identity is what the cloud-init seed says of the VM: its instance ID (the VMI's UID, so
// that cloud-init runs its once-per-instance modules once per VMI) and its host name.
type Identity struct {
	UID, Name string
}

// Prepare finds and writes the VMI's boot files and disks. A migration target prepares the same
// files at the same paths, so that the arriving guest finds its read-only disks where it left them.
// claims are the VMI's record of its claims (status.volumeStatus): a ReadWriteMany claim's disk
// is attached as shared, which a migration leaves where it is.
func Prepare(ctx context.Context, spec v1alpha1.VirtualMachineInstanceSpec, claims []v1alpha1.VolumeStatus, id Identity, dirs Dirs) (Prepared, error) {
	// Node files (admin-allowed, checked by the launcher before) are used as they are.
	p := Prepared{Kernel: spec.Boot.Kernel, Initrd: spec.Boot.Initrd}
	if c := spec.Boot.Container; c != nil {
		var err error
		if p.Kernel, err = InImage(dirs.KernelBoot, c.KernelPath); err != nil {
			return p, fmt.Errorf("boot.container kernelPath: %w", err)
		}
		if c.InitrdPath != "" {
			if p.Initrd, err = InImage(dirs.KernelBoot, c.InitrdPath); err != nil {
				return p, fmt.Errorf("boot.container initrdPath: %w", err)
			}
		}
	}
	volumes := map[string]v1alpha1.Volume{}
	for _, v := range spec.Volumes {
		volumes[v.Name] = v
	}
	for _, d := range spec.Disks {
		v, ok := volumes[d.Name]
		if !ok {
			return p, fmt.Errorf("disk %q names no volume of spec.volumes", d.Name)
		}
		disk, err := prepareVolume(ctx, v, claims, id, dirs)
		if err != nil {
			return p, fmt.Errorf("volume %q: %w", v.Name, err)
		}
		disk.Bus = d.Bus
		p.Disks = append(p.Disks, disk)
	}
	return p, nil
}

func prepareVolume(ctx context.Context, v v1alpha1.Volume, claims []v1alpha1.VolumeStatus, id Identity, dirs Dirs) (domain.Disk, error) {
	switch {
	case v.PersistentVolumeClaim != nil:
		_, shared := v1alpha1.ReadWriteMany(claims, v.Name)
		if v1alpha1.BlockClaim(claims, v.Name) {
			device := filepath.Join(dirs.ClaimDevices, v.Name)
			if err := isBlockDevice(device); err != nil {
				return domain.Disk{}, fmt.Errorf("persistentVolumeClaim %q: %w", v.PersistentVolumeClaim.ClaimName, err)
			}
			return domain.Disk{Path: device, Format: "raw", Block: true, Shared: shared}, nil
		}
		var capacity int64
		if info := v1alpha1.ClaimInfo(claims, v.Name); info != nil {
			capacity = info.Capacity.Storage().Value()
		}
		image := filepath.Join(dirs.Claims, v.Name, contract.ClaimDiskFile)
		if err := ensureClaimDisk(image, capacity); err != nil {
			return domain.Disk{}, fmt.Errorf("persistentVolumeClaim %q: %w", v.PersistentVolumeClaim.ClaimName, err)
		}
		return domain.Disk{Path: image, Format: "raw", Shared: shared}, nil
	case v.ContainerDisk != nil:
		image, err := containerDiskImage(filepath.Join(dirs.ContainerDisks, v.Name), v.ContainerDisk.Path)
		if err != nil {
			return domain.Disk{}, err
		}
		overlay := filepath.Join(dirs.State, v.Name+".qcow2")
		if err := writeOverlay(ctx, image, overlay); err != nil {
			return domain.Disk{}, err
		}
		return domain.Disk{Path: overlay, Format: "qcow2"}, nil
	case v.CloudInitNoCloud != nil:
		src := *v.CloudInitNoCloud
		if src.UserDataSecretRef != nil {
			data, err := secretUserData(filepath.Join(dirs.Secrets, v.Name))
			if err != nil {
				return domain.Disk{}, fmt.Errorf("the user data of Secret %q: %w", src.UserDataSecretRef.Name, err)
			}
			src.UserData = data
		}
		seed := filepath.Join(dirs.State, v.Name+".iso")
		if err := WriteNoCloudSeed(seed, src, id); err != nil {
			return domain.Disk{}, err
		}
		return domain.Disk{Path: seed, Format: "raw", ReadOnly: true}, nil
	}
	return domain.Disk{}, errors.New("no source this launcher knows")
}

// InImage is the file at path inside the image mounted at root, with every symlink resolved
// inside the image. The file must exist and be a regular file.
func InImage(root, path string) (string, error) {
	full, err := securejoin.SecureJoin(root, path)
	if err != nil {
		return "", fmt.Errorf("%s in the image: %w", path, err)
	}
	info, err := os.Stat(full)
	if err != nil {
		return "", fmt.Errorf("%s in the image: %w", path, errors.Unwrap(err))
	}
	if !info.Mode().IsRegular() {
		return "", fmt.Errorf("%s in the image is not a regular file", path)
	}
	return full, nil
}

// defaultDiskDir is where a containerDisk image keeps its disk image (KubeVirt's convention).
const defaultDiskDir = "/disk"

// containerDiskImage is the disk image of a containerDisk: path, or else the one file in /disk.
func containerDiskImage(root, path string) (string, error) {
	if path != "" {
		return InImage(root, path)
	}
	dir, err := securejoin.SecureJoin(root, defaultDiskDir)
	if err != nil {
		return "", err
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return "", fmt.Errorf("the image has no %s directory with the disk image (set containerDisk.path): %w", defaultDiskDir, errors.Unwrap(err))
	}
	var files []string
	for _, e := range entries {
		if e.Type()&fs.ModeType == 0 || e.Type()&fs.ModeSymlink != 0 {
			files = append(files, e.Name())
		}
	}
	if len(files) != 1 {
		return "", fmt.Errorf("the image's %s holds %d files %q, want one disk image (or set containerDisk.path)", defaultDiskDir, len(files), files)
	}
	return InImage(root, filepath.Join(defaultDiskDir, files[0]))
}

// imageInfo is what qemu-img info says of an image that matters here.
type imageInfo struct {
	Format          string `json:"format"`
	BackingFilename string `json:"backing-filename"`
}

// writeOverlay writes a qcow2 overlay on image, which the guest writes instead of the image.
// The image's format is probed, which is safe only because the image is read-only to the guest
// and may name no other file of its own: a qcow2 image naming a backing file or an external data
// file would make QEMU open a file of its author's choosing in the launcher's file system (its
// cloud-init Secrets, another disk), and give it to the guest as the disk's contents.
func writeOverlay(ctx context.Context, image, overlay string) error {
	// Before qemu-img, which opens an image's data file to describe it.
	dataFile, err := qcow2DataFile(image)
	if err != nil {
		return err
	}
	if dataFile != nil {
		return fmt.Errorf("the disk image keeps its data in an external file (%q): a containerDisk must be one self-contained image", *dataFile)
	}
	out, err := qemuImg(ctx, "info", "--output=json", image)
	if err != nil {
		return err
	}
	var info imageInfo
	if err := json.Unmarshal(out, &info); err != nil {
		return fmt.Errorf("reading qemu-img info of the disk image: %w", err)
	}
	switch {
	case info.Format != "qcow2" && info.Format != "raw":
		return fmt.Errorf("the disk image is %s, want qcow2 or raw", info.Format)
	case info.BackingFilename != "":
		return fmt.Errorf("the disk image names a backing file (%q): a containerDisk must be one self-contained image", info.BackingFilename)
	}
	if err := os.Remove(overlay); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	_, err = qemuImg(ctx, "create", "-q", "-f", "qcow2", "-b", image, "-F", info.Format, overlay)
	return err
}

// The parts of a qcow2 header (QEMU's docs/interop/qcow2.rst) that say whether an image's data
// is in another file, and which.
const (
	qcow2Magic             = "QFI\xfb"
	qcow2IncompatDataFile  = 1 << 2     // incompatible feature bit: an external data file
	qcow2ExtDataFile       = 0x44415441 // header extension: the external data file's name
	qcow2HeaderReadLimit   = 1 << 16    // the header and its extensions fit in the first cluster (at least 512 bytes, 64 KiB by default)
	qcow2IncompatOffset    = 72
	qcow2HeaderLenOffset   = 100
	qcow2MinHeaderV3Length = 104
)

// qcow2DataFile reads image's qcow2 header, as QEMU would probe it: nil if the image is not qcow2
// (version 3, the first with an external data file) or keeps its data in itself, else the data
// file's name (empty if the header names none, when QEMU would take one from its options).
func qcow2DataFile(image string) (*string, error) {
	f, err := os.Open(image)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	h := make([]byte, qcow2HeaderReadLimit)
	n, err := io.ReadFull(f, h)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("reading the disk image's header: %w", err)
	}
	h = h[:n]
	if len(h) < qcow2MinHeaderV3Length || string(h[:4]) != qcow2Magic || binary.BigEndian.Uint32(h[4:8]) < 3 {
		return nil, nil
	}
	if binary.BigEndian.Uint64(h[qcow2IncompatOffset:])&qcow2IncompatDataFile == 0 {
		return nil, nil
	}
	name := ""
	// Header extensions follow the header: type, length, data padded to 8 bytes; type 0 ends them.
	for off := int(binary.BigEndian.Uint32(h[qcow2HeaderLenOffset:])); off+8 <= len(h); {
		typ, length := binary.BigEndian.Uint32(h[off:]), int(binary.BigEndian.Uint32(h[off+4:]))
		data := off + 8
		if typ == 0 || length > len(h)-data {
			break
		}
		if typ == qcow2ExtDataFile {
			name = string(h[data : data+length])
			break
		}
		off = data + (length+7)&^7
	}
	return &name, nil
}

func qemuImg(ctx context.Context, args ...string) ([]byte, error) {
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "qemu-img", args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("qemu-img %s: %w: %s", args[0], err, bytes.TrimSpace(stderr.Bytes()))
	}
	return out, nil
}

// fileSystemOverhead is the part of a claim's file system left free when disk.img is made to
// fill it (KubeVirt's default, 5.5%): the file system's own structures need room.
const fileSystemOverhead = 0.055

// isBlockDevice checks that the kubelet gave the pod a block device at path for a Block claim.
func isBlockDevice(path string) error {
	info, err := os.Stat(path)
	if err != nil {
		return err
	}
	if info.Mode().Type() != fs.ModeDevice {
		return fmt.Errorf("%s is not a block device (%s)", path, info.Mode().Type())
	}
	return nil
}

// ensureClaimDisk makes disk.img on a claim that has none: a sparse raw image filling the claim
// (its capacity, or its file system where that is smaller or the capacity unknown), less the
// file system's overhead, in whole MiB. An existing one is the user's data and is kept as it is.
func ensureClaimDisk(path string, capacity int64) error {
	// Not followed: whoever else mounts the claim could make disk.img a symlink to a file of the
	// launcher's (another VM's socket, the node's run directory) or a device node.
	if info, err := os.Lstat(path); err == nil {
		if !info.Mode().IsRegular() {
			return fmt.Errorf("%s on the claim is not a regular file (%s)", contract.ClaimDiskFile, info.Mode().Type())
		}
		return nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	var st unix.Statfs_t
	if err := unix.Statfs(filepath.Dir(path), &st); err != nil {
		return fmt.Errorf("measuring the claim's file system: %w", err)
	}
	room := int64(st.Blocks * uint64(st.Bsize))
	if capacity > 0 && capacity < room {
		room = capacity
	}
	size := int64(float64(room)*(1-fileSystemOverhead)) &^ (1<<20 - 1)
	if size <= 0 {
		return fmt.Errorf("the claim (%d bytes) has no room for a disk", room)
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o660)
	if err != nil {
		return err
	}
	if err := f.Truncate(size); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// secretKeys are the keys of a user-data Secret, in the order they are looked for (KubeVirt's).
var secretKeys = []string{"userdata", "userData"}

// secretUserData reads the user data from a Secret volume mounted at dir.
func secretUserData(dir string) (string, error) {
	for _, key := range secretKeys {
		data, err := os.ReadFile(filepath.Join(dir, key))
		if err == nil {
			return string(data), nil
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return "", err
		}
	}
	return "", fmt.Errorf("the Secret has none of the keys %q", secretKeys)
}
