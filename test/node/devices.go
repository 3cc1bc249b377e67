package node

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
)

// shimDevice is a device node the shim makes in a container, as a runtime makes the devices a
// device plugin allocated: owned by the container's user and group (containerd's
// device_ownership_from_security_context), whatever the node's own node allows.
type shimDevice struct {
	Path  string `json:"path"`
	Major uint32 `json:"major"`
	Minor uint32 `json:"minor"`
	// Block is a block device (a Block-mode claim's volumeDevice); otherwise a character device.
	Block bool `json:"block,omitempty"`
}

// containerDevices are the devices of the extended resources c asks for that the node has
// (Config.Devices).
func containerDevices(devices map[corev1.ResourceName]string, c *corev1.Container) ([]shimDevice, error) {
	var out []shimDevice
	for _, name := range slices.Sorted(func(yield func(corev1.ResourceName) bool) {
		for n := range c.Resources.Limits {
			if !yield(n) {
				return
			}
		}
	}) {
		path, ok := devices[name]
		if !ok {
			continue
		}
		var st unix.Stat_t
		if err := unix.Stat(path, &st); err != nil {
			return nil, fmt.Errorf("device %s of %s: %w", path, name, err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFCHR {
			return nil, fmt.Errorf("device %s of %s is not a character device", path, name)
		}
		out = append(out, shimDevice{Path: path, Major: unix.Major(st.Rdev), Minor: unix.Minor(st.Rdev)})
	}
	return out, nil
}

// claimDevices are the block devices of c's volumeDevices, at their devicePath: the devices of
// the claims' PersistentVolumes (prepareVolumes resolved them), as the kubelet maps Block volumes.
func claimDevices(l layout, pod *corev1.Pod, c *corev1.Container) ([]shimDevice, error) {
	var out []shimDevice
	for _, d := range c.VolumeDevices {
		source := l.api.known(pod, d.Name)
		if source == "" {
			return nil, fmt.Errorf("volumeDevice %q: no Block persistentVolumeClaim volume of that name was prepared", d.Name)
		}
		var st unix.Stat_t
		if err := unix.Stat(source, &st); err != nil {
			return nil, fmt.Errorf("volumeDevice %q: %w", d.Name, err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFBLK {
			return nil, fmt.Errorf("volumeDevice %q: %s is not a block device", d.Name, source)
		}
		out = append(out, shimDevice{Path: d.DevicePath, Major: unix.Major(st.Rdev), Minor: unix.Minor(st.Rdev), Block: true})
	}
	return out, nil
}

// makeDevices makes each device in a tmpfs mounted at staging (a directory of the pod's, seen
// only in the container's mount namespace) and binds it at its path, owned by the container's
// user, read-write for it and its group only.
func makeDevices(devices []shimDevice, staging string, user credentials) error {
	if len(devices) == 0 {
		return nil
	}
	if err := os.MkdirAll(staging, 0o700); err != nil {
		return err
	}
	if err := unix.Mount("tmpfs", staging, "tmpfs", unix.MS_NOSUID|unix.MS_NOEXEC, "mode=0755,size=64k"); err != nil {
		return fmt.Errorf("mounting the devices' tmpfs: %w", err)
	}
	for i, d := range devices {
		node := filepath.Join(staging, fmt.Sprint(i))
		kind := uint32(unix.S_IFCHR)
		if d.Block {
			kind = unix.S_IFBLK
		}
		if err := unix.Mknod(node, kind|0o660, int(unix.Mkdev(d.Major, d.Minor))); err != nil {
			return fmt.Errorf("making %s: %w", d.Path, err)
		}
		if err := os.Chown(node, int(user.UID), int(user.GID)); err != nil {
			return err
		}
		if err := bind(bindMount{Source: node, Target: d.Path}); err != nil {
			return fmt.Errorf("binding %s: %w", d.Path, err)
		}
	}
	return nil
}
