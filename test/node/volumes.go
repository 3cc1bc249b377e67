package node

import (
	"cmp"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
)

// bindMount makes a file or directory of the machine visible at Target inside a container.
type bindMount struct {
	Source   string `json:"source"`
	Target   string `json:"target"`
	ReadOnly bool   `json:"readOnly,omitempty"`
}

// containerMounts resolves the volumeMounts of c to bind mounts, shallowest target first so
// that nested mounts land on top of their parents, as container runtimes order them. Mounts of
// volumes other than hostPath, emptyDir, image, persistentVolumeClaim and secret are skipped and
// named in skipped.
func containerMounts(l layout, pod *corev1.Pod, c *corev1.Container) (mounts []bindMount, skipped []string) {
	for _, m := range c.VolumeMounts {
		i := slices.IndexFunc(pod.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == m.Name })
		if i < 0 {
			skipped = append(skipped, m.Name)
			continue
		}
		source := volumeSource(l, pod, &pod.Spec.Volumes[i])
		if source == "" {
			skipped = append(skipped, m.Name)
			continue
		}
		mounts = append(mounts, bindMount{
			Source: filepath.Join(source, m.SubPath),
			Target: filepath.Clean(m.MountPath),
			// An image volume is read-only whatever the mount says, as the kubelet mounts it.
			ReadOnly: m.ReadOnly || pod.Spec.Volumes[i].Image != nil,
		})
	}
	slices.SortStableFunc(mounts, func(a, b bindMount) int {
		return cmp.Compare(strings.Count(a.Target, "/"), strings.Count(b.Target, "/"))
	})
	return mounts, skipped
}

// volumeSource is where volume's data lives on this machine, or "" for an unsupported type.
func volumeSource(l layout, pod *corev1.Pod, v *corev1.Volume) string {
	switch {
	case v.HostPath != nil:
		return l.hostPath(v.HostPath.Path)
	case v.EmptyDir != nil:
		return l.emptyDir(pod.UID, v.Name)
	case v.Image != nil:
		return l.images.known(v.Image.Reference)
	case v.PersistentVolumeClaim != nil:
		return l.api.known(pod, v.Name)
	case v.Secret != nil:
		return l.secretDir(pod.UID, v.Name)
	default:
		return ""
	}
}

// prepareVolumes makes the volumes c mounts ready, as the kubelet's volume manager does before
// a container starts: hostPath type checks (creating what the type asks to create), emptyDir
// and subPath directories, the images of image volumes, pulled from the node's image store, and
// the PersistentVolumes of claims and the keys of Secrets.
func prepareVolumes(l layout, pod *corev1.Pod, c *corev1.Container) error {
	for _, m := range c.VolumeMounts {
		i := slices.IndexFunc(pod.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == m.Name })
		if i < 0 {
			continue
		}
		v := &pod.Spec.Volumes[i]
		var err error
		switch {
		case v.HostPath != nil:
			err = prepareHostPath(l.hostPath(v.HostPath.Path), ptr.Deref(v.HostPath.Type, corev1.HostPathUnset))
		case v.EmptyDir != nil:
			err = prepareEmptyDir(l.emptyDir(pod.UID, v.Name))
		case v.Image != nil:
			if m.SubPath != "" {
				return fmt.Errorf("volume %q: an image volume cannot be mounted with a subPath", v.Name)
			}
			_, err = l.images.root(v.Image.Reference)
		case v.PersistentVolumeClaim != nil:
			err = l.api.resolve(pod, v)
		case v.Secret != nil:
			err = l.api.writeSecret(pod, v, l.secretDir(pod.UID, v.Name))
		default:
			continue
		}
		if err == nil && m.SubPath != "" {
			err = os.MkdirAll(filepath.Join(volumeSource(l, pod, v), m.SubPath), 0o755)
		}
		if err != nil {
			return fmt.Errorf("volume %q: %w", v.Name, err)
		}
	}
	for _, d := range c.VolumeDevices {
		i := slices.IndexFunc(pod.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == d.Name })
		if i < 0 || pod.Spec.Volumes[i].PersistentVolumeClaim == nil {
			return fmt.Errorf("volumeDevice %q: want a persistentVolumeClaim volume of that name", d.Name)
		}
		if err := l.api.resolve(pod, &pod.Spec.Volumes[i]); err != nil {
			return fmt.Errorf("volume %q: %w", d.Name, err)
		}
	}
	return nil
}

// prepareHostPath checks path against a hostPath volume's type. An unset type is not checked,
// but a missing path is created as a directory, as containerd does.
func prepareHostPath(path string, t corev1.HostPathType) error {
	switch t {
	case corev1.HostPathUnset, corev1.HostPathDirectoryOrCreate:
		return os.MkdirAll(path, 0o755)
	case corev1.HostPathFileOrCreate:
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		f, err := os.OpenFile(path, os.O_CREATE|os.O_RDONLY, 0o644)
		if err != nil {
			return err
		}
		return f.Close()
	}
	info, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("hostPath type check failed: %w", err)
	}
	mode := info.Mode()
	ok := map[corev1.HostPathType]bool{
		corev1.HostPathDirectory: mode.IsDir(),
		corev1.HostPathFile:      mode.IsRegular(),
		corev1.HostPathSocket:    mode&fs.ModeSocket != 0,
		corev1.HostPathCharDev:   mode&fs.ModeCharDevice != 0,
		corev1.HostPathBlockDev:  mode&fs.ModeDevice != 0 && mode&fs.ModeCharDevice == 0,
	}[t]
	if !ok {
		return fmt.Errorf("hostPath type check failed: %s is not a %s", path, t)
	}
	return nil
}

// prepareEmptyDir creates an emptyDir volume world-writable, as the kubelet does.
func prepareEmptyDir(path string) error {
	if err := os.MkdirAll(path, 0o777); err != nil {
		return err
	}
	return os.Chmod(path, 0o777)
}
