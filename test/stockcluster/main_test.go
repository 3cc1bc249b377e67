package stockcluster

import (
	"bufio"
	"fmt"
	"os"
	"runtime/debug"
	"strconv"
	"testing"
)

// allocatorEnv makes the test binary the memory allocator of the pressure test (allocate).
const allocatorEnv = "LIFEBOAT_STOCK_ALLOCATOR"

func TestMain(m *testing.M) {
	if os.Getenv(allocatorEnv) != "" {
		runAllocator()
		return
	}
	os.Exit(m.Run())
}

// runAllocator holds memory on the machine: each line on its standard input is a number of MiB to
// allocate and touch more, or, negative, to give back (whole earlier allocations, latest first),
// each answered "ok"; it exits when its input ends.
func runAllocator() {
	var held [][]byte
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		mib, err := strconv.Atoi(in.Text())
		if err != nil {
			fmt.Println("bad line:", in.Text())
			os.Exit(2)
		}
		if mib < 0 {
			for freed := 0; freed < -mib && len(held) > 0; held = held[:len(held)-1] {
				freed += len(held[len(held)-1]) >> 20
			}
			debug.FreeOSMemory()
			fmt.Println("ok")
			continue
		}
		b := make([]byte, mib<<20)
		for i := 0; i < len(b); i += 4096 {
			b[i] = 1
		}
		held = append(held, b)
		fmt.Println("ok")
	}
	_ = held
}
