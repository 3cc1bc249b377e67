package vmdisks

import (
	"errors"
	"fmt"
	"io/fs"
	"os"

	diskfs "github.com/diskfs/go-diskfs"
	"github.com/diskfs/go-diskfs/disk"
	"github.com/diskfs/go-diskfs/filesystem"
	"github.com/diskfs/go-diskfs/filesystem/iso9660"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

// NoCloudLabel is the volume label cloud-init's NoCloud data source looks for.
const NoCloudLabel = "cidata"

// seedSize bounds the seed image: two 64 KiB documents and the file system's own blocks fit.
const seedSize = 1 << 20

// WriteNoCloudSeed writes cloud-init's NoCloud seed to path: an ISO 9660 file system labelled
// cidata (with Rock Ridge names, as genisoimage -rock writes them) holding meta-data,
// user-data and, if given, network-config.
func WriteNoCloudSeed(path string, src v1alpha1.CloudInitNoCloudSource, id Identity) error {
	files := []struct{ name, data string }{
		{"meta-data", fmt.Sprintf("instance-id: %s\nlocal-hostname: %s\n", id.UID, id.Name)},
		{"user-data", src.UserData},
	}
	if src.NetworkData != "" {
		files = append(files, struct{ name, data string }{"network-config", src.NetworkData})
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	d, err := diskfs.Create(path, seedSize, diskfs.SectorSizeDefault)
	if err != nil {
		return fmt.Errorf("creating the cloud-init seed: %w", err)
	}
	defer d.Close()
	d.LogicalBlocksize = 2048
	fsys, err := d.CreateFilesystem(disk.FilesystemSpec{Partition: 0, FSType: filesystem.TypeISO9660, VolumeLabel: NoCloudLabel})
	if err != nil {
		return fmt.Errorf("creating the cloud-init seed's file system: %w", err)
	}
	for _, f := range files {
		w, err := fsys.OpenFile("/"+f.name, os.O_CREATE|os.O_RDWR)
		if err != nil {
			return fmt.Errorf("writing %s to the cloud-init seed: %w", f.name, err)
		}
		if _, err := w.Write([]byte(f.data)); err != nil {
			return fmt.Errorf("writing %s to the cloud-init seed: %w", f.name, err)
		}
		if err := w.Close(); err != nil {
			return fmt.Errorf("writing %s to the cloud-init seed: %w", f.name, err)
		}
	}
	iso, ok := fsys.(*iso9660.FileSystem)
	if !ok {
		return errors.New("creating the cloud-init seed: the file system is not ISO 9660")
	}
	if err := iso.Finalize(iso9660.FinalizeOptions{RockRidge: true, VolumeIdentifier: NoCloudLabel}); err != nil {
		return fmt.Errorf("finishing the cloud-init seed: %w", err)
	}
	return nil
}
