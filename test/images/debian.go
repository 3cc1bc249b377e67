package images

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/lifeboat-vm/lifeboat/api/launcher"
	"github.com/lifeboat-vm/lifeboat/test/internal/cache"
)

// The Debian userland of the agent and launcher images: Debian 12, the release lifeboat's
// binaries are built and tested on, so that the libvirt they link against is the one they find.
const (
	suite  = "bookworm"
	mirror = "http://deb.debian.org/debian"
	// sourceDateEpoch fixes every timestamp mmdebstrap writes: the same packages give the same tarball.
	sourceDateEpoch = "1700000000"
)

// debianPackages are what the launcher needs for its private libvirtd and QEMU (libvirt-daemon
// brings libvirt0, which the agent needs too). Not libvirt-daemon-system: its services, sockets
// and users are for a host's libvirtd, not the launcher's private one. qemu-utils (qemu-img)
// writes containerDisk overlays (launcher/vmdisks).
var debianPackages = []string{"libvirt-daemon", "libvirt-daemon-driver-qemu", "qemu-system-x86", "qemu-utils"}

// qemuFromBackports pins QEMU and the firmware it requires to bookworm-backports (QEMU 10), as on
// the host (hack/install-deps): bookworm's 7.2 under TCG loses guest writes on every dirty-bitmap
// sync after the second (upstream 03bfc2188f), and lifeboat's 100 ms downtime target
// (agent.MaxDowntime) brings more of them. Everything else, libvirt included, stays bookworm's.
// The pin names the codename (n=): the archive name (a=) is now oldstable-backports.
const qemuFromBackports = "Package: qemu-* seabios ipxe-qemu\nPin: release n=" + suite + "-backports\nPin-Priority: 990\n"

// mmdebstrapArgs builds the rootfs as a tarball at out. The hooks make what libvirtd refuses to
// start without (see domain/libvirtd_config.go): the group kvm and the user and group
// libvirt-qemu, which libvirt-daemon-system and udev would create, and the launcher's user.
func mmdebstrapArgs(out string) []string {
	return []string{
		"--variant=essential",
		"--format=tar",
		"--include=" + strings.Join(debianPackages, ","),
		`--setup-hook=mkdir -p "$1"/etc/apt/preferences.d && printf '` + qemuFromBackports + `' > "$1"/etc/apt/preferences.d/lifeboat-qemu`,
		"--dpkgopt=path-exclude=/usr/share/man/*",
		"--dpkgopt=path-exclude=/usr/share/locale/*",
		"--dpkgopt=path-exclude=/usr/share/doc/*",
		"--dpkgopt=path-include=/usr/share/doc/*/copyright",
		`--customize-hook=chroot "$1" groupadd --system kvm`,
		`--customize-hook=chroot "$1" groupadd --system libvirt-qemu`,
		`--customize-hook=chroot "$1" useradd --system --no-create-home --home-dir /var/lib/libvirt --shell /usr/sbin/nologin --gid libvirt-qemu libvirt-qemu`,
		// The launcher's own user (api/launcher UID and GID), which its session libvirtd must
		// find a record of to serve it.
		fmt.Sprintf(`--customize-hook=chroot "$1" groupadd --non-unique --gid %d lifeboat-launcher`, launcher.GID),
		fmt.Sprintf(`--customize-hook=chroot "$1" useradd --non-unique --uid %d --gid %d --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin lifeboat-launcher`, launcher.UID, launcher.GID),
		// Logs and caches of the build itself (apt, dpkg) are not part of the image.
		`--customize-hook=rm -rf "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/* "$1"/var/log/*`,
		suite, out, mirror, securitySource, backportsSource,
	}
}

// securitySource is the apt source of Debian's security updates, besides the mirror.
var securitySource = "deb " + strings.Replace(mirror, "/debian", "/debian-security", 1) + " " + suite + "-security main"

// backportsSource is the apt source of QEMU (qemuFromBackports). apt takes nothing else from it:
// Debian pins backports below the release.
var backportsSource = "deb " + mirror + " " + suite + "-backports main"

// DebianRootfs returns the path of the Debian rootfs tarball, building it with mmdebstrap
// (Debian package mmdebstrap) the first time, then from the cache: $LIFEBOAT_CACHE/images/.
// Building takes a minute or two and downloads about 100 MB of packages.
func DebianRootfs(ctx context.Context, progress io.Writer) (string, error) {
	dir, err := cache.Dir()
	if err != nil {
		return "", err
	}
	dir = filepath.Join(dir, "images")
	// The name changes with the recipe, so a changed recipe is built afresh.
	sum := sha256.Sum256([]byte(strings.Join(mmdebstrapArgs(""), "\n")))
	path := filepath.Join(dir, "debian-"+suite+"-"+hex.EncodeToString(sum[:6])+".tar")
	unlock, err := cache.Lock(filepath.Join(dir, "debian.lock"))
	if err != nil {
		return "", err
	}
	defer unlock()
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	if _, err := exec.LookPath("mmdebstrap"); err != nil {
		return "", fmt.Errorf("building the Debian rootfs of the images needs mmdebstrap (apt-get install mmdebstrap): %w", err)
	}
	fmt.Fprintf(progress, "building the images' Debian %s rootfs with mmdebstrap (%s) into %s\n", suite, strings.Join(debianPackages, " "), path)
	tmp := path + ".tmp"
	if err := run(ctx, progress, "mmdebstrap", mmdebstrapArgs(tmp)...); err != nil {
		_ = os.Remove(tmp)
		return "", err
	}
	return path, os.Rename(tmp, path)
}
