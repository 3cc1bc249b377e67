package main

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// headroom is memory left to the kernel and init itself when deciding whether the asked
// dirty size fits: running PID 1 out of memory panics the kernel.
const headroom = 24 << 20

// dirtyTick is how often the rewriting goroutine catches up with its rate: often enough
// that the rate is even at the scale a migration iteration sees.
const dirtyTick = 50 * time.Millisecond

// startDirtying allocates size bytes outside the Go heap, writes every page of it, and
// if rate > 0 keeps rewriting rate bytes per second of it, page by page, in a goroutine.
func startDirtying(con *console, size, rate int64) error {
	meminfo, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return fmt.Errorf("reading /proc/meminfo to check the dirty size fits: %w", err)
	}
	available, err := memAvailable(string(meminfo))
	if err != nil {
		return err
	}
	if size > available-headroom {
		return fmt.Errorf("cannot dirty %d bytes: only %d bytes are available and %d must stay free", size, available, int64(headroom))
	}
	mem, err := unix.Mmap(-1, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return fmt.Errorf("allocating %d bytes to dirty: %w", size, err)
	}
	page := os.Getpagesize()
	pages := len(mem) / page
	// Non-zero bytes, so that migration cannot send the pages as zero pages.
	for i := 0; i < pages; i++ {
		mem[i*page] = 1
	}
	if rate > 0 && pages > 0 {
		goSafely(con, "dirtying memory", func() { rewrite(mem, page, rate) })
	}
	return nil
}

// rewrite changes one byte in each page, in order and wrapping around, at rate bytes
// per second: a page with one changed byte is a whole dirty page to a migration.
func rewrite(mem []byte, page int, rate int64) {
	pages := int64(len(mem) / page)
	start := time.Now()
	var done int64
	ticker := time.NewTicker(dirtyTick)
	for range ticker.C {
		due := pagesDue(rate, time.Since(start), page)
		for ; done < due; done++ {
			mem[(done%pages)*int64(page)]++
		}
	}
}

// pagesDue is how many pages must have been rewritten after elapsed to keep rate bytes per second.
func pagesDue(rate int64, elapsed time.Duration, page int) int64 {
	return int64(float64(rate) * elapsed.Seconds() / float64(page))
}

// memAvailable reads MemAvailable from the text of /proc/meminfo, in bytes.
func memAvailable(meminfo string) (int64, error) {
	sc := bufio.NewScanner(strings.NewReader(meminfo))
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 3 && fields[0] == "MemAvailable:" && fields[2] == "kB" {
			kb, err := strconv.ParseInt(fields[1], 10, 64)
			if err != nil {
				return 0, fmt.Errorf("parsing MemAvailable %q: %w", fields[1], err)
			}
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("no MemAvailable line in /proc/meminfo")
}
