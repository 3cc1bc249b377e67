package main

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/lifeboat-vm/lifeboat/test/guest/protocol"
)

// reportDisks says what the guest's virtio disks hold: the first line of the cloud-init seed's
// user-data (a read-only disk with an ISO 9660 file system), and for each writable disk its
// label, after writing protocol.DiskWritten behind it, so a test can see what reached the guest
// and that its writes land in the overlay, not the image. It returns the first writable disk,
// for the journal, or "".
func reportDisks(con *console) (journal string) {
	devs, _ := filepath.Glob("/sys/block/vd*")
	for _, sys := range devs {
		dev := filepath.Base(sys)
		ro, err := os.ReadFile(filepath.Join(sys, "ro"))
		if err != nil {
			con.errorf("disk %s: %v", dev, err)
			continue
		}
		if strings.TrimSpace(string(ro)) == "1" {
			err = reportSeed(con, dev)
		} else if err = labelAndWrite(con, dev); err == nil && journal == "" {
			journal = dev
		}
		if err != nil {
			con.errorf("disk %s: %v", dev, err)
		}
	}
	return journal
}

// appendJournal writes entry n of the journal on dev and checks the whole journal, read from
// the disk: the block device's buffers are dropped first, so that what the guest wrote before a
// migration is read from the disk the guest has now, not from its memory.
func appendJournal(dev string, n int) error {
	f, err := os.OpenFile("/dev/"+dev, os.O_RDWR|os.O_SYNC, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	var entry [8]byte
	binary.LittleEndian.PutUint64(entry[:], uint64(n))
	if _, err := f.WriteAt(entry[:], protocol.JournalOffset+8*int64(n-1)); err != nil {
		return err
	}
	if err := unix.IoctlSetInt(int(f.Fd()), unix.BLKFLSBUF, 0); err != nil {
		return fmt.Errorf("dropping the disk's buffers: %w", err)
	}
	journal := make([]byte, 8*n)
	if _, err := f.ReadAt(journal, protocol.JournalOffset); err != nil {
		return err
	}
	for i := range n {
		if got := binary.LittleEndian.Uint64(journal[8*i:]); got != uint64(i+1) {
			return fmt.Errorf("journal entry %d holds %d, want %d", i+1, got, i+1)
		}
	}
	return nil
}

func reportSeed(con *console, dev string) error {
	mnt := "/mnt/" + dev
	if err := os.MkdirAll(mnt, 0o755); err != nil {
		return err
	}
	if err := unix.Mount("/dev/"+dev, mnt, "iso9660", unix.MS_RDONLY, ""); err != nil {
		return fmt.Errorf("mounting it as ISO 9660: %w", err)
	}
	f, err := os.Open(filepath.Join(mnt, "user-data"))
	if err != nil {
		return err
	}
	defer f.Close()
	first := bufio.NewScanner(f)
	first.Scan()
	con.println(protocol.UserData(first.Text()))
	return first.Err()
}

func labelAndWrite(con *console, dev string) error {
	f, err := os.OpenFile("/dev/"+dev, os.O_RDWR|os.O_SYNC, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	head := make([]byte, protocol.DiskLabelSize)
	if _, err := f.ReadAt(head, 0); err != nil {
		return err
	}
	label, _, _ := bytes.Cut(head, []byte{0})
	if _, err := f.WriteAt([]byte(protocol.DiskWritten), protocol.DiskLabelSize); err != nil {
		return err
	}
	con.println(protocol.Disk(dev, string(label)))
	return nil
}
