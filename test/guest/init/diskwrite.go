package main

import (
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/lifeboat-vm/lifeboat/test/guest/protocol"
)

// diskWriter writes the blocks of a disk's span in order at a rate, checking each block's stamp
// before it writes the block again (protocol.DiskBlock).
type diskWriter struct {
	f    *os.File
	buf  []byte   // one block, page-aligned as direct I/O needs
	last []uint64 // the pass whose stamp each block holds; 0 for none yet
}

// startDiskWriting opens dev for direct I/O and writes span bytes of it from
// protocol.DiskWriteOffset on at rate bytes per second, in a goroutine.
func startDiskWriting(con *console, dev string, span, rate int64) error {
	f, err := os.OpenFile("/dev/"+dev, os.O_RDWR|unix.O_DIRECT, 0)
	if err != nil {
		return err
	}
	size, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		f.Close()
		return fmt.Errorf("reading its size: %w", err)
	}
	blocks := span / protocol.DiskBlock
	if end := protocol.DiskWriteOffset + blocks*protocol.DiskBlock; end > size {
		f.Close()
		return fmt.Errorf("writing %d bytes from %d needs a disk of %d bytes at least; it has %d", span, protocol.DiskWriteOffset, end, size)
	}
	buf, err := unix.Mmap(-1, 0, protocol.DiskBlock, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		f.Close()
		return err
	}
	w := &diskWriter{f: f, buf: buf, last: make([]uint64, blocks)}
	goSafely(con, "writing disk "+dev, func() { w.run(con, dev, rate) })
	return nil
}

// run writes at rate until the guest stops. A writer that falls behind (the disk slowed it)
// does not catch up in a burst: it drops what it missed, as an application would write less.
func (w *diskWriter) run(con *console, dev string, rate int64) {
	blocks := int64(len(w.last))
	start := time.Now()
	var done int64
	ticker := time.NewTicker(dirtyTick)
	perTick := max(1, int64(float64(rate)*dirtyTick.Seconds()/protocol.DiskBlock))
	failed := false
	passStart := start
	for range ticker.C {
		due := int64(float64(rate) * time.Since(start).Seconds() / protocol.DiskBlock)
		done = max(done, due-perTick)
		for ; done < due; done++ {
			pass, block := uint64(done/blocks)+1, done%blocks
			if err := w.write(pass, block); err != nil && !failed {
				// Once: a disk that lost a write keeps failing every check after it.
				con.errorf("disk %s: %v", dev, err)
				failed = true
			}
			if block == blocks-1 {
				now := time.Now()
				if !failed {
					achieved := float64(blocks*protocol.DiskBlock) / now.Sub(passStart).Seconds()
					con.println(protocol.DiskPass(dev, int(pass), int64(achieved)))
				}
				passStart = now
			}
		}
	}
}

// write checks that block holds the stamp it was last given, then stamps it with pass.
func (w *diskWriter) write(pass uint64, block int64) error {
	off := protocol.DiskWriteOffset + block*protocol.DiskBlock
	if prev := w.last[block]; prev != 0 {
		if _, err := w.f.ReadAt(w.buf, off); err != nil {
			return fmt.Errorf("reading block %d: %w", block, err)
		}
		if p, b := binary.LittleEndian.Uint64(w.buf), binary.LittleEndian.Uint64(w.buf[8:]); p != prev || b != uint64(block) {
			return fmt.Errorf("block %d holds pass %d of block %d, want pass %d", block, p, b, prev)
		}
	}
	// The stamp all through the block: no block is ever zeros, which a copy could skip.
	for i := 0; i < len(w.buf); i += 16 {
		binary.LittleEndian.PutUint64(w.buf[i:], pass)
		binary.LittleEndian.PutUint64(w.buf[i+8:], uint64(block))
	}
	if _, err := w.f.WriteAt(w.buf, off); err != nil {
		return fmt.Errorf("writing block %d: %w", block, err)
	}
	w.last[block] = pass
	return nil
}
