package chart

import (
	"bufio"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
)

// ParseMatrix reads the deadline matrix's table as BenchmarkDeadlineMatrix prints it (the rows
// of its Markdown table, among any other lines), so that a recorded run can be drawn again.
func ParseMatrix(r io.Reader) ([]MatrixCell, error) {
	var cells []MatrixCell
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if !strings.HasPrefix(line, "| ") || strings.HasPrefix(line, "| memory ") {
			continue
		}
		f := strings.Split(strings.Trim(line, "|"), "|")
		for i := range f {
			f[i] = strings.TrimSpace(f[i])
		}
		// memory | dirty rate | grace | bound | policy | in time | total | downtime at the switch | ...
		if len(f) < 8 {
			continue
		}
		var c MatrixCell
		factor, _, _ := strings.Cut(f[1], " ")
		c.Row = fmt.Sprintf("%s %s, %s", shortGuest(f[0]), factor, f[2])
		c.Policy = f[4]
		if _, err := fmt.Sscanf(f[5], "%d/%d", &c.InTime, &c.Runs); err != nil {
			return nil, fmt.Errorf("in time %q: %w", f[5], err)
		}
		median, _, _ := strings.Cut(f[7], " / ")
		if median != "–" {
			d, err := time.ParseDuration(median)
			if err != nil {
				return nil, fmt.Errorf("downtime %q: %w", f[7], err)
			}
			c.Stop, c.Finished = d, true
		}
		cells = append(cells, c)
	}
	return cells, sc.Err()
}

// shortGuest is the memory column without what the disk-writing guests' runs saw.
func shortGuest(s string) string {
	s, _, _ = strings.Cut(s, " (seen")
	s = strings.Replace(s, "disk 128 MiB written at ", "disk ", 1)
	return s
}

// ParseBench reads go test's benchmark lines and returns, per run of the named benchmark (any
// sub-benchmark, any GOMAXPROCS suffix), its metrics by unit.
func ParseBench(r io.Reader, name string) ([]map[string]float64, error) {
	var runs []map[string]float64
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 || !strings.HasPrefix(f[0], name) {
			continue
		}
		run := map[string]float64{}
		for i := 2; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				return nil, fmt.Errorf("%q: %w", sc.Text(), err)
			}
			run[f[i+1]] = v
		}
		runs = append(runs, run)
	}
	return runs, sc.Err()
}

// NetworkRuns are the network benchmark's runs from its metrics (interruption-ms, guest-stop-ms,
// downtime-ms; a metric a run lacks is zero).
func NetworkRuns(runs []map[string]float64) []Interruption {
	ms := func(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }
	out := make([]Interruption, len(runs))
	for i, r := range runs {
		out[i] = Interruption{Run: strconv.Itoa(i + 1), Interruption: ms(r["interruption-ms"]), Stop: ms(r["guest-stop-ms"]), Downtime: ms(r["downtime-ms"])}
	}
	return out
}
