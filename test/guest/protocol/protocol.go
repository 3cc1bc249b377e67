// Package protocol is what the test guest reads from its kernel command line and its image,
// and what it prints on its serial console. The guest's /init, the image builder and the
// tests that watch the guest share it, so they cannot drift apart.
package protocol

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// Lines the guest prints, each alone on a line of the serial console.
const (
	// Ready is printed once init has set up everything it serves (mounts, power button,
	// dirty memory), so a test that sees it can act on the guest at once.
	Ready = "lifeboat-guest ready"
	// CounterPrefix starts the line printed once a second, followed by 1, 2, 3, ...
	CounterPrefix = "lifeboat-guest counter "
	// PowerButton is printed when the ACPI power button is pressed, just before power-off.
	PowerButton = "lifeboat-guest power button: shutting down"
	// ErrorPrefix starts a line that reports something init could not do; it keeps running.
	ErrorPrefix = "lifeboat-guest error: "
	// HeardPrefix starts the guest's answer to a line typed on its serial console, followed
	// by that line: what a console session can check reached the guest.
	HeardPrefix = "lifeboat-guest heard "
)

// Kernel command-line parameters the guest understands.
const (
	// DirtyParam is how much memory the guest allocates and writes, in bytes with an
	// optional K, M or G suffix (binary units): lifeboat.dirty=64M.
	DirtyParam = "lifeboat.dirty"
	// DirtyRateParam is how many bytes per second of that memory the guest keeps
	// rewriting, with the same suffixes: lifeboat.dirtyrate=8M.
	DirtyRateParam = "lifeboat.dirtyrate"
	// TickParam is how often the guest prints its counter, a Go duration (a second when
	// unset): lifeboat.tick=50ms. A fine tick shows a pause of the guest to that precision.
	TickParam = "lifeboat.tick"
	// DiskRateParam is how many bytes per second the guest writes to its first writable disk
	// (see DiskWriteOffset), with the same suffixes: lifeboat.diskrate=8M.
	DiskRateParam = "lifeboat.diskrate"
	// DiskSpanParam is how much of that disk the writes go round, with the same suffixes
	// (DiskBlock when unset): lifeboat.diskspan=256M.
	DiskSpanParam = "lifeboat.diskspan"
	// SpoofParam makes the guest try, once a second, to pass as other hosts on its network
	// (see Spoofing): lifeboat.spoof=192.0.2.1:9 names where its datagrams go.
	SpoofParam = "lifeboat.spoof"
)

// Spoofing: with SpoofParam, once its network is up the guest sends, each second, through its
// card's raw socket: a UDP datagram from ForgedAddress of its own, one from its own address but
// ForgedMAC, and a gratuitous ARP reply giving its gateway's address as its own MAC; then, as
// itself through its kernel's stack, a datagram saying how many forgeries it has sent so far
// (Genuine). Every datagram goes to the address SpoofParam names, through its gateway.
const (
	ForgedMAC           = "02:5a:5a:5a:5a:5a"
	ForgedPayloadPrefix = "lifeboat-guest forged "
	GenuinePrefix       = "lifeboat-guest genuine, forgeries sent before: "
)

// ForgedAddress is the address the guest forges beside its own: the same subnet's host .250.
func ForgedAddress(own netip.Addr) netip.Addr {
	b := own.As4()
	b[3] = 250
	return netip.AddrFrom4(b)
}

// Genuine is the payload of the guest's own datagram after it sent forged frames.
func Genuine(forged int) string { return GenuinePrefix + strconv.Itoa(forged) }

// ModulesFile lists, one absolute path a line and dependencies first, the kernel modules
// in the image that init loads before anything else (the ACPI power button driver and the
// input event interface that reports its presses).
const ModulesFile = "/etc/lifeboat-guest/modules"

// Counter formats the counter line for n.
func Counter(n int) string { return CounterPrefix + strconv.Itoa(n) }

// Heard is the guest's answer to the console input line.
func Heard(line string) string { return HeardPrefix + line }

// Dirtying is the line the guest prints once its dirty memory is allocated.
func Dirtying(size, rate int64) string {
	return fmt.Sprintf("lifeboat-guest dirtying %d bytes at %d bytes/s", size, rate)
}

// LastCounter returns the highest counter in console output, and false if there is none.
func LastCounter(console string) (int, bool) {
	last, found := 0, false
	for _, line := range strings.Split(console, "\n") {
		rest, ok := strings.CutPrefix(strings.TrimRight(line, "\r"), CounterPrefix)
		if !ok {
			continue
		}
		if n, err := strconv.Atoi(rest); err == nil && n >= last {
			last, found = n, true
		}
	}
	return last, found
}

// ParseSize parses a byte count with an optional K, M or G suffix (powers of 1024).
func ParseSize(s string) (int64, error) {
	multiplier := int64(1)
	digits := s
	if n := len(s); n > 0 {
		switch s[n-1] {
		case 'K', 'k':
			multiplier, digits = 1<<10, s[:n-1]
		case 'M', 'm':
			multiplier, digits = 1<<20, s[:n-1]
		case 'G', 'g':
			multiplier, digits = 1<<30, s[:n-1]
		}
	}
	v, err := strconv.ParseInt(digits, 10, 64)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("size %q: want a non-negative number of bytes with an optional K, M or G suffix", s)
	}
	if v > (1<<62)/multiplier {
		return 0, fmt.Errorf("size %q is too large", s)
	}
	return v * multiplier, nil
}

// Disk lines: what init found on the guest's disks at boot.
const (
	// UserDataPrefix starts the line with the first line of the cloud-init seed's user-data.
	UserDataPrefix = "lifeboat-guest user-data: "
	// DiskPrefix starts the line naming a writable disk, its label and what init wrote to it.
	DiskPrefix = "lifeboat-guest disk "
	// DiskLabelSize is how much of a disk's start is its label, up to the first NUL; init
	// writes DiskWritten just after it.
	DiskLabelSize = 512
	// DiskWritten is what init writes to every writable disk, after the label.
	DiskWritten = "written by the guest"
)

// UserData is the line for a seed whose user-data starts with first.
func UserData(first string) string { return UserDataPrefix + first }

// Disk is the line for writable disk dev, labelled label, after init wrote DiskWritten to it.
func Disk(dev, label string) string {
	return fmt.Sprintf("%s%s: label %q, wrote %q", DiskPrefix, dev, label, DiskWritten)
}

// The journal: once a second, init appends the counter to its first writable disk, as an 8-byte
// little-endian number at JournalOffset + 8*(n-1), then reads the whole journal back from the
// disk (not its page cache) and checks that it holds 1, 2, …, n. Every JournalEvery entries it
// prints Journal(dev, n); a gap or a wrong value is printed as an error line instead.
const (
	JournalOffset = 4096
	JournalEvery  = 5
)

// Journal is the line saying the journal on dev holds 1..n intact, read from the disk.
func Journal(dev string, n int) string {
	return fmt.Sprintf("%s%s: journal 1..%d intact", DiskPrefix, dev, n)
}

// LastJournal returns the highest n of the Journal lines for dev in console, and false if none.
func LastJournal(console, dev string) (int, bool) {
	prefix := DiskPrefix + dev + ": journal 1.."
	last, found := 0, false
	for _, line := range strings.Split(console, "\n") {
		rest, ok := strings.CutPrefix(strings.TrimRight(line, "\r"), prefix)
		if !ok {
			continue
		}
		if n, err := strconv.Atoi(strings.TrimSuffix(rest, " intact")); err == nil && n >= last {
			last, found = n, true
		}
	}
	return last, found
}

// Disk writing: with DiskRateParam, init writes DiskBlock-sized blocks of its first writable disk
// from DiskWriteOffset on, in order and wrapping round at DiskSpanParam, at the asked rate, each
// with direct I/O (not through the guest's page cache, so that the writes dirty the disk, not the
// guest's memory). Each block carries a stamp (pass and block number); before a block is written
// again it is read back and its stamp checked, so a write a migration lost or replayed shows as an
// error line. Every full pass prints DiskPass.
const (
	DiskWriteOffset = 1 << 20
	DiskBlock       = 1 << 20
)

// DiskWriting is the line the guest prints once it starts writing span bytes of dev at rate bytes/s.
func DiskWriting(dev string, span, rate int64) string {
	return fmt.Sprintf("%s%s: writing %d bytes at %d bytes/s", DiskPrefix, dev, span, rate)
}

// DiskPass is the line saying pass n over dev's span was written, every block of it checked
// first, at rate bytes per second (from the pass's start to its end, by the guest's clock).
func DiskPass(dev string, n int, rate int64) string {
	return fmt.Sprintf("%s%s: pass %d written at %d bytes/s, every block checked", DiskPrefix, dev, n, rate)
}

// DiskPasses returns the pass numbers and rates of the DiskPass lines for dev in console, in
// the order printed.
func DiskPasses(console, dev string) (passes []int, rates []int64) {
	prefix := DiskPrefix + dev + ": pass "
	for _, line := range strings.Split(console, "\n") {
		rest, ok := strings.CutPrefix(strings.TrimRight(line, "\r"), prefix)
		if !ok {
			continue
		}
		var n int
		var rate int64
		if _, err := fmt.Sscanf(rest, "%d written at %d bytes/s, every block checked", &n, &rate); err == nil {
			passes, rates = append(passes, n), append(rates, rate)
		}
	}
	return passes, rates
}

// LastDiskPass returns the highest n of the DiskPass lines for dev in console, and false if none.
func LastDiskPass(console, dev string) (int, bool) {
	passes, _ := DiskPasses(console, dev)
	if len(passes) == 0 {
		return 0, false
	}
	return slices.Max(passes), true
}

// The guest's network: with a network card, init asks DHCP for its address and answers on
// ServePort, to every TCP connection, one Answer line.
const (
	// ServePort is the TCP port the guest answers on.
	ServePort = 8080
	// NetworkPrefix starts the line init prints once DHCP gave the card its address:
	// "lifeboat-guest network 10.0.2.2/24 via 10.0.2.1 mac 02:...".
	NetworkPrefix = "lifeboat-guest network "
	answerPrefix  = "lifeboat-guest "
)

// Network is the line for the address DHCP gave the card with the MAC address mac.
func Network(address, gateway, mac string) string {
	return fmt.Sprintf("%s%s via %s mac %s", NetworkPrefix, address, gateway, mac)
}

// Answer is what the guest sends a client: its boot's random identity, which a reboot
// changes and a migration does not, and its counter at that moment.
func Answer(boot string, counter int) string {
	return fmt.Sprintf("%sboot %s counter %d", answerPrefix, boot, counter)
}

// ParseAnswer reads an Answer line.
func ParseAnswer(line string) (boot string, counter int, err error) {
	var b string
	var n int
	if _, err := fmt.Sscanf(strings.TrimSpace(line), answerPrefix+"boot %s counter %d", &b, &n); err != nil {
		return "", 0, fmt.Errorf("not a guest's answer: %q", line)
	}
	return b, n, nil
}
