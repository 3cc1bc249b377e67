package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/lifeboat-vm/lifeboat/test/guest/protocol"
)

// Debian's cloud kernel builds the ACPI button driver and the evdev interface as modules
// (CONFIG_ACPI_BUTTON=m, CONFIG_INPUT_EVDEV=m), so the image carries them and init loads
// them; a press of the power button then arrives as KEY_POWER on /dev/input/event*.

// loadModules loads the modules listed in list, in order. A module already in the kernel
// (built in, or loaded before) is fine.
func loadModules(list string) error {
	b, err := os.ReadFile(list)
	if err != nil {
		return fmt.Errorf("reading the module list: %w", err)
	}
	var errs []error
	for _, path := range strings.Fields(string(b)) {
		if err := loadModule(path); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func loadModule(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("loading module: %w", err)
	}
	defer f.Close()
	if err := unix.FinitModule(int(f.Fd()), "", 0); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("loading module %s: %w", path, err)
	}
	return nil
}

// watchPowerButton reads every input device and powers the guest off on a press of
// KEY_POWER. The devices exist once loadModules returned: the drivers probe and
// devtmpfs creates their nodes before finit_module returns.
func watchPowerButton(con *console) error {
	devices, err := filepath.Glob("/dev/input/event*")
	if err != nil {
		return err
	}
	if len(devices) == 0 {
		return errors.New("no /dev/input/event* devices: the ACPI power button will be ignored")
	}
	for _, path := range devices {
		f, err := os.Open(path)
		if err != nil {
			return fmt.Errorf("opening input device: %w", err)
		}
		goSafely(con, "reading "+path, func() {
			defer f.Close()
			if err := waitForPowerKey(f); err != nil {
				con.errorf("reading %s: %v", path, err)
				return
			}
			powerOff(con)
		})
	}
	return nil
}

// inputEventSize is sizeof(struct input_event) on 64-bit Linux: a timeval, then
// type (u16), code (u16) and value (s32).
const inputEventSize = 24

const (
	evKey    = 0x01
	keyPower = 116
)

// waitForPowerKey returns when r delivers a press of KEY_POWER.
func waitForPowerKey(r io.Reader) error {
	buf := make([]byte, inputEventSize)
	for {
		if _, err := io.ReadFull(r, buf); err != nil {
			return err
		}
		if isPowerPress(buf) {
			return nil
		}
	}
}

// isPowerPress reports whether one struct input_event is KEY_POWER going down.
func isPowerPress(event []byte) bool {
	typ := binary.LittleEndian.Uint16(event[16:18])
	code := binary.LittleEndian.Uint16(event[18:20])
	value := int32(binary.LittleEndian.Uint32(event[20:24]))
	return typ == evKey && code == keyPower && value == 1
}

func powerOff(con *console) {
	con.println(protocol.PowerButton)
	unix.Sync()
	if err := unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF); err != nil {
		con.errorf("powering off: %v", err)
	}
}
