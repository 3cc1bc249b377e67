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
		if err := unix.Mknod(node, unix.S_IFCHR|0o660, int(unix.Mkdev(d.Major, d.Minor))); err != nil {
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
