package node

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// credentials is who a container's process runs as, and whether it may gain privileges.
type credentials struct {
	UID    uint32   `json:"uid"`
	GID    uint32   `json:"gid"`
	Groups []uint32 `json:"groups,omitempty"`
	// NoNewPrivs is allowPrivilegeEscalation: false (the kernel's no_new_privs, as runc sets it).
	NoNewPrivs bool `json:"noNewPrivs,omitempty"`
}

// containerCredentials applies the pod's and the container's securityContext as a runtime
// does: the container's runAsUser, runAsGroup and runAsNonRoot over the pod's; fsGroup and
// supplementalGroups as supplementary groups. There are no images, so a container without
// runAsUser runs as root (an image's USER would say otherwise), and runAsNonRoot refuses it,
// as the kubelet does (CreateContainerConfigError).
func containerCredentials(pod *corev1.Pod, c *corev1.Container) (credentials, error) {
	var cr credentials
	var nonRoot bool
	if sc := pod.Spec.SecurityContext; sc != nil {
		if sc.RunAsUser != nil {
			cr.UID = uint32(*sc.RunAsUser)
		}
		if sc.RunAsGroup != nil {
			cr.GID = uint32(*sc.RunAsGroup)
		}
		if sc.FSGroup != nil {
			cr.Groups = append(cr.Groups, uint32(*sc.FSGroup))
		}
		for _, g := range sc.SupplementalGroups {
			cr.Groups = append(cr.Groups, uint32(g))
		}
		nonRoot = sc.RunAsNonRoot != nil && *sc.RunAsNonRoot
	}
	if sc := c.SecurityContext; sc != nil {
		if sc.RunAsUser != nil {
			cr.UID = uint32(*sc.RunAsUser)
		}
		if sc.RunAsGroup != nil {
			cr.GID = uint32(*sc.RunAsGroup)
		}
		if sc.RunAsNonRoot != nil {
			nonRoot = *sc.RunAsNonRoot
		}
		cr.NoNewPrivs = sc.AllowPrivilegeEscalation != nil && !*sc.AllowPrivilegeEscalation
	}
	if nonRoot && cr.UID == 0 {
		return cr, fmt.Errorf("container has runAsNonRoot and image will run as root (pod: %q, container: %s)", pod.Namespace+"/"+pod.Name, c.Name)
	}
	return cr, nil
}

// userRecords returns bind mounts over /etc/passwd and /etc/group that add a record for the
// container's user and group where the machine has none: a container sees the machine's files
// here, and its image, which would name its user, is the machine. Programs that look their
// user up (libvirt does) then find it. The files are written in dir.
func userRecords(user credentials, dir string) ([]bindMount, error) {
	var mounts []bindMount
	for _, f := range []struct {
		path string
		id   uint32
		line string
	}{
		{"/etc/passwd", user.UID, fmt.Sprintf("container-%d:x:%d:%d::/nonexistent:/usr/sbin/nologin\n", user.UID, user.UID, user.GID)},
		{"/etc/group", user.GID, fmt.Sprintf("container-%d:x:%d:\n", user.GID, user.GID)},
	} {
		if f.id == 0 {
			continue
		}
		machine, err := os.ReadFile(f.path)
		if err != nil {
			return nil, err
		}
		if hasID(machine, f.id) {
			continue
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
		copied := filepath.Join(dir, filepath.Base(f.path))
		if err := os.WriteFile(copied, append(machine, f.line...), 0o644); err != nil {
			return nil, err
		}
		mounts = append(mounts, bindMount{Source: copied, Target: f.path, ReadOnly: true})
	}
	return mounts, nil
}

// hasID reports whether a passwd or group file has a record with the numeric id (third field).
func hasID(file []byte, id uint32) bool {
	for _, line := range strings.Split(string(file), "\n") {
		if fields := strings.Split(line, ":"); len(fields) > 2 && fields[2] == strconv.FormatUint(uint64(id), 10) {
			return true
		}
	}
	return false
}
