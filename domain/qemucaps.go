package domain

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// MaxQEMUCapabilities bounds a capabilities cache file taken from elsewhere: libvirt 9.0's for
// qemu-system-x86_64 is about 100 KiB.
const MaxQEMUCapabilities = 4 << 20

// qemuCapsDir is where libvirt's QEMU driver keeps its capabilities cache: one file per QEMU
// binary, named for the SHA-256 of the binary's path.
func (l daemonLayout) qemuCapsDir() string {
	if l.session {
		return filepath.Join(l.cacheDir(), "libvirt", "qemu", "cache", "capabilities")
	}
	return filepath.Join(l.cacheDir(), "qemu", "capabilities")
}

// QEMUCapabilities returns the capabilities cache file the daemon wrote for its QEMU once
// Conn.LoadQEMUCapabilities made it probe the binary. A daemon started with another daemon's
// file (Config.QEMUCapabilities) starts without probing QEMU, where libvirt finds the file
// still true of this machine: the same QEMU and libvirt binaries (by their change times),
// kernel, microcode and access to /dev/kvm.
func (d *Libvirtd) QEMUCapabilities() ([]byte, error) {
	files, err := filepath.Glob(filepath.Join(d.layout.qemuCapsDir(), "*.xml"))
	if err != nil {
		return nil, err
	}
	if len(files) != 1 {
		return nil, fmt.Errorf("want one QEMU capabilities cache file in %s, found %d", d.layout.qemuCapsDir(), len(files))
	}
	return os.ReadFile(files[0])
}

// qemuCapsName is the name libvirt looks for caps under: the SHA-256 of the path of the QEMU
// binary they describe.
func qemuCapsName(caps []byte) (string, error) {
	if len(caps) > MaxQEMUCapabilities {
		return "", fmt.Errorf("a QEMU capabilities cache of %d bytes, more than %d", len(caps), MaxQEMUCapabilities)
	}
	emulator, err := capsEmulator(caps)
	if err != nil {
		return "", fmt.Errorf("reading a QEMU capabilities cache: %w", err)
	}
	emulator = strings.TrimSpace(emulator)
	if !filepath.IsAbs(emulator) || filepath.Clean(emulator) != emulator {
		return "", fmt.Errorf("a QEMU capabilities cache for %q, not an absolute path", emulator)
	}
	sum := sha256.Sum256([]byte(emulator))
	return hex.EncodeToString(sum[:]) + ".xml", nil
}

// capsEmulator is the text of the <emulator> child of caps's <qemuCaps>, the first child where
// libvirt writes it. It reads no further: decoding the whole file (100 KiB) left a launcher
// almost a megabyte of garbage at its start, and the daemon that loads the file parses it anyway.
func capsEmulator(caps []byte) (string, error) {
	d := xml.NewDecoder(bytes.NewReader(caps))
	depth := 0
	for {
		tok, err := d.Token()
		if err == io.EOF {
			return "", errors.New("no <emulator> in its <qemuCaps>")
		}
		if err != nil {
			return "", err
		}
		switch t := tok.(type) {
		case xml.StartElement:
			if depth == 0 && t.Name.Local != "qemuCaps" {
				return "", fmt.Errorf("a <%s> document, not <qemuCaps>", t.Name.Local)
			}
			if depth == 1 && t.Name.Local == "emulator" {
				var emulator string
				err := d.DecodeElement(&emulator, &t)
				return emulator, err
			}
			depth++
		case xml.EndElement:
			depth--
		}
	}
}

// CheckQEMUCapabilities says whether caps is a capabilities cache file that names the QEMU
// binary it describes, as one given in Config.QEMUCapabilities must.
func CheckQEMUCapabilities(caps []byte) error {
	_, err := qemuCapsName(caps)
	return err
}

// writeQEMUCaps puts caps where the daemon of l looks for its QEMU's capabilities.
func writeQEMUCaps(l daemonLayout, caps []byte) error {
	if len(caps) == 0 {
		return nil
	}
	name, err := qemuCapsName(caps)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(l.qemuCapsDir(), 0o700); err != nil {
		return fmt.Errorf("creating libvirt's capabilities cache: %w", err)
	}
	path := filepath.Join(l.qemuCapsDir(), name)
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return os.WriteFile(path, caps, 0o600)
}
