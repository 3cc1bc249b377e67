// Command init is the test guest's /init: a static program that runs as PID 1 in a
// Linux guest booted from the lifeboat test image. It prints a ready line and then a
// counter every second on the serial console, can keep a chosen amount of memory dirty
// at a chosen rate (kernel command line, see package protocol), answers each line typed on
// its console, can try to pass as other hosts on its network (protocol.SpoofParam), and
// powers the guest off when the ACPI power button is pressed.
//
// PID 1 must never exit (the kernel would panic), so every failure is printed and init
// goes on counting.
package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/lifeboat-vm/lifeboat/test/guest/protocol"
)

func main() {
	con := &console{w: os.Stdout}
	defer func() {
		// A panic in main would end PID 1; report it and count instead.
		if r := recover(); r != nil {
			con.errorf("init: %v", r)
			count(con, "", time.Second)
		}
	}()

	if err := mountFilesystems(); err != nil {
		con.errorf("%v", err)
	}
	if err := loadModules(protocol.ModulesFile); err != nil {
		con.errorf("%v", err)
	}
	if err := watchPowerButton(con); err != nil {
		con.errorf("%v", err)
	}
	journal := reportDisks(con)
	params, errs := parseCmdline(readCmdline())
	for _, err := range errs {
		con.errorf("%v", err)
	}
	if params.dirty > 0 {
		if err := startDirtying(con, params.dirty, params.dirtyRate); err != nil {
			con.errorf("%v", err)
		} else {
			con.println(protocol.Dirtying(params.dirty, params.dirtyRate))
		}
	}
	if params.diskRate > 0 {
		if journal == "" {
			con.errorf("%s: there is no writable disk to write", protocol.DiskRateParam)
		} else if err := startDiskWriting(con, journal, params.diskSpan, params.diskRate); err != nil {
			con.errorf("disk %s: %v", journal, err)
		} else {
			con.println(protocol.DiskWriting(journal, params.diskSpan, params.diskRate))
		}
	}
	if err := startNetwork(con, params.spoof); err != nil {
		con.errorf("network: %v", err)
	}
	goSafely(con, "console input", func() { answerInput(con, os.Stdin) })
	con.println(protocol.Ready)
	tick := time.Second
	if params.tick > 0 {
		tick = params.tick
	}
	count(con, journal, tick)
}

// count prints the counter every tick, forever, and keeps the journal on disk journal if
// there is one (see protocol.JournalOffset).
func count(con *console, journal string, tick time.Duration) {
	ticker := time.NewTicker(tick)
	for n := 1; ; n++ {
		<-ticker.C
		counter.Store(int64(n))
		con.println(protocol.Counter(n))
		if journal == "" {
			continue
		}
		if err := appendJournal(journal, n); err != nil {
			con.errorf("disk %s: %v", journal, err)
			journal = ""
		} else if n%protocol.JournalEvery == 0 {
			con.println(protocol.Journal(journal, n))
		}
	}
}

// answerInput answers every line typed on the console (the terminal echoes it as typed, too).
func answerInput(con *console, in io.Reader) {
	lines := bufio.NewScanner(in)
	for lines.Scan() {
		con.println(protocol.Heard(strings.TrimRight(lines.Text(), "\r")))
	}
}

func readCmdline() string {
	b, err := os.ReadFile("/proc/cmdline")
	if err != nil {
		return ""
	}
	return string(b)
}

// console writes whole lines to the serial console; goroutines share it.
type console struct {
	mu sync.Mutex
	w  io.Writer
}

func (c *console) println(line string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, _ = io.WriteString(c.w, line+"\n")
}

func (c *console) errorf(format string, args ...any) {
	c.println(protocol.ErrorPrefix + fmt.Sprintf(format, args...))
}

// goSafely runs fn in a goroutine whose panic is reported instead of ending PID 1.
func goSafely(con *console, name string, fn func()) {
	go func() {
		defer func() {
			if r := recover(); r != nil {
				con.errorf("%s: %v", name, r)
			}
		}()
		fn()
	}()
}
