package images

import (
	"fmt"
	"os"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/match"

	"github.com/lifeboat-vm/lifeboat/test/guest"
	"github.com/lifeboat-vm/lifeboat/test/guest/protocol"
)

// The test guest as images, so that a VMI boots it without naming a node path: its kernel and
// initrd for spec.boot.container, and a small raw disk for a containerDisk volume.
const (
	GuestKernelImage = Registry + "test-guest-kernel:" + Tag
	GuestKernelPath  = "/boot/vmlinuz"
	GuestInitrdPath  = "/boot/initrd.img"
	GuestDiskImage   = Registry + "test-guest-disk:" + Tag
	// GuestDiskPath is the disk image in GuestDiskImage, where KubeVirt's containerDisks keep it.
	GuestDiskPath = "/disk/data.raw"
	// GuestDiskLabel starts the disk, for the guest to print (protocol.Disk).
	GuestDiskLabel = "lifeboat test disk"
	guestDiskSize  = 1 << 20
)

// GuestImages are the test guest's images by name.
func GuestImages(g guest.Image) (map[string]v1.Image, error) {
	kernel, err := os.ReadFile(g.Kernel)
	if err != nil {
		return nil, err
	}
	initrd, err := os.ReadFile(g.Initrd)
	if err != nil {
		return nil, err
	}
	disk := make([]byte, guestDiskSize)
	copy(disk, GuestDiskLabel)
	if len(GuestDiskLabel) >= protocol.DiskLabelSize {
		return nil, fmt.Errorf("the disk label is longer than the guest reads")
	}
	out := map[string]v1.Image{}
	for ref, files := range map[string]map[string][]byte{
		GuestKernelImage: {GuestKernelPath: kernel, GuestInitrdPath: initrd},
		GuestDiskImage:   {GuestDiskPath: disk},
	} {
		layer, err := FileLayer(files, 0o644)
		if err != nil {
			return nil, err
		}
		if out[ref], err = NewImage(v1.Config{}, layer); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// WriteStore puts images (by name) into the OCI image layout at dir, creating it if needed and
// replacing an image of the same name: the image store of emulated nodes (test/node Config.Images).
func WriteStore(dir string, images map[string]v1.Image) error {
	lp, err := layout.FromPath(dir)
	if err != nil {
		if lp, err = layout.Write(dir, empty.Index); err != nil {
			return err
		}
	}
	for ref, img := range images {
		annotations := map[string]string{AnnotationImageName: ref}
		if err := lp.ReplaceImage(img, match.Annotation(AnnotationImageName, ref), layout.WithAnnotations(annotations)); err != nil {
			return fmt.Errorf("writing %s to the image store: %w", ref, err)
		}
	}
	return nil
}
