package chart

import (
	"bytes"
	"encoding/xml"
	"errors"
	"io"
	"strings"
	"testing"
	"time"
)

// wellFormed fails unless svg is one well-formed XML document whose root is <svg>, and returns
// its text: what a browser would show in it.
func wellFormed(t *testing.T, svg []byte) string {
	t.Helper()
	d := xml.NewDecoder(bytes.NewReader(svg))
	var text strings.Builder
	depth, roots := 0, 0
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("the SVG is not well-formed XML: %v\n%s", err, svg)
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			if depth == 0 {
				roots++
				if tok.Name.Local != "svg" {
					t.Fatalf("the root element is <%s>, not <svg>", tok.Name.Local)
				}
			}
			depth++
		case xml.EndElement:
			depth--
		case xml.CharData:
			text.Write(tok)
			text.WriteByte('\n')
		}
	}
	if roots != 1 || depth != 0 {
		t.Fatalf("%d root elements, %d left open", roots, depth)
	}
	return text.String()
}

func shows(t *testing.T, text string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(text, w) {
			t.Errorf("the chart does not show %q; its text:\n%s", w, text)
		}
	}
}

func TestMatrix(t *testing.T) {
	var svg bytes.Buffer
	err := Matrix(&svg, "the matrix", []MatrixCell{
		{Row: "256 MiB 0, 15s", Policy: "lifeboat", InTime: 3, Runs: 3, Stop: 60 * time.Millisecond, Finished: true},
		{Row: "256 MiB 0, 15s", Policy: "kubevirt", InTime: 3, Runs: 3, Stop: 40 * time.Millisecond, Finished: true},
		{Row: "1024 MiB 1.5x, 15s", Policy: "lifeboat", InTime: 1, Runs: 3, Stop: 15420 * time.Millisecond, Finished: true},
		{Row: "1024 MiB 1.5x, 15s", Policy: "kubevirt", InTime: 0, Runs: 3},
	})
	if err != nil {
		t.Fatal(err)
	}
	shows(t, wellFormed(t, svg.Bytes()), "the matrix", "lifeboat", "kubevirt", "256 MiB 0, 15s", "1024 MiB 1.5x, 15s",
		"in time, every run", "in time, some runs", "in time, no run", "3/3, stop 60ms", "1/3, stop 15.42s", "0/3, not moved")
}

func TestMigrationTimeline(t *testing.T) {
	var samples []Sample
	for i := range 10 {
		samples = append(samples, Sample{At: time.Duration(i) * 500 * time.Millisecond, Remaining: uint64(10-i) * 32 << 20,
			DirtyRate: 48 << 20, TransferRate: 64 << 20})
	}
	var svg bytes.Buffer
	if err := MigrationTimeline(&svg, Timeline{Title: "a migration", Samples: samples, Deadline: 15 * time.Second,
		Switch: 4500 * time.Millisecond, Done: 5 * time.Second}); err != nil {
		t.Fatal(err)
	}
	shows(t, wellFormed(t, svg.Bytes()), "a migration", "memory left to send", "dirty rate", "transfer rate", "switch-over", "deadline", "MiB left", "MiB/s")
}

func TestInterruptions(t *testing.T) {
	var svg bytes.Buffer
	if err := Interruptions(&svg, "the network", []Interruption{
		{Run: "1", Interruption: 623 * time.Millisecond, Stop: 110 * time.Millisecond, Downtime: 66 * time.Millisecond},
		{Run: "2", Interruption: 647 * time.Millisecond, Stop: 150 * time.Millisecond, Downtime: 125 * time.Millisecond},
	}); err != nil {
		t.Fatal(err)
	}
	shows(t, wellFormed(t, svg.Bytes()), "the network", "longest without an answer", "the guest's stop at the switch (its counter)",
		"libvirt's downtime (on the target)", "milliseconds")

	// Runs recorded before the guest's stop was measured: no series for it.
	svg.Reset()
	if err := Interruptions(&svg, "the network", []Interruption{{Run: "1", Interruption: 623 * time.Millisecond, Downtime: 66 * time.Millisecond}}); err != nil {
		t.Fatal(err)
	}
	if text := wellFormed(t, svg.Bytes()); strings.Contains(text, "the guest's stop") {
		t.Errorf("a series the runs did not measure is drawn:\n%s", text)
	}
}

func TestDrain(t *testing.T) {
	s := func(name string, from, to float64) Stage {
		return Stage{Name: name, Start: time.Duration(from * float64(time.Second)), End: time.Duration(to * float64(time.Second))}
	}
	var svg bytes.Buffer
	if err := Drain(&svg, "a drain", []DrainVM{
		{VMI: "vm-0", Stages: []Stage{s("target pod starting", 0.1, 3), s("migrating", 3, 9)}},
		{VMI: "vm-1", Stages: []Stage{s("target pod starting", 9, 12), s("migrating", 12, 18)}},
	}); err != nil {
		t.Fatal(err)
	}
	shows(t, wellFormed(t, svg.Bytes()), "a drain", "vm-0", "vm-1", "target pod starting", "migrating", "seconds since the drain's start")
}

// The matrix drawn again from a recorded table reads its rows as the benchmark printed them.
func TestParseMatrix(t *testing.T) {
	table := `BenchmarkDeadlineMatrix/mem=256Mi/dirty=0/policy=kubevirt-2   1   4200000000 ns/op
| memory | dirty rate asked / estimated / seen | grace | bound | policy | in time | total | downtime seen by the guest at the switch: median / worst | libvirt's downtime | longest stall: median / worst | modes | guest after |
|---|---|---|---|---|---|---|---|---|---|---|---|
| 256 MiB | 0 = 0 / 0 / 0 MiB/s | 15s | 4s (fits) | lifeboat | 3/3 | 4.2s | 60ms / 70ms | 25ms | 60ms / 70ms | PreCopy | counting |
| 1024 MiB | 1.5x = 96 / 95 / 0 MiB/s | 15s | 16s (does not fit) | kubevirt | 0/3 | aborted at 1m0s | – | – | – | PreCopy | not moved |
| 256 MiB, disk 128 MiB written at 0.5x = 32 MiB/s (seen 32 MiB/s before the migration, 20 during) | 0 = 0 / 1 / 0 MiB/s | 30s | 6s (fits) | lifeboat | 3/3 | 5.4s | 100ms / 100ms | 58ms | 100ms / 100ms | PreCopy | counting, disk intact |
| memory | dirty rate asked / estimated / seen | grace | bound | policy | in time | total | downtime seen by the guest at the switch: median / worst | paused: floor, the stop ÷ floor per paused run | libvirt's downtime | longest stall: median / worst | modes | guest after |
| 1024 MiB, rewriting 256 MiB | 1x = 64 / 63 / 64 MiB/s | 15s | 16s (does not fit) | lifeboat | 1/1 | 12.1s | 4.5s / 4.5s | 4.2s: 1.07 × | 4.4s | 4.5s / 4.5s | PreCopy→AutoConverge→Paused | counting |
`
	cells, err := ParseMatrix(strings.NewReader(table))
	if err != nil {
		t.Fatal(err)
	}
	want := []MatrixCell{
		{Row: "256 MiB 0, 15s", Policy: "lifeboat", InTime: 3, Runs: 3, Stop: 60 * time.Millisecond, Finished: true},
		{Row: "1024 MiB 1.5x, 15s", Policy: "kubevirt", InTime: 0, Runs: 3},
		{Row: "256 MiB, disk 0.5x = 32 MiB/s 0, 30s", Policy: "lifeboat", InTime: 3, Runs: 3, Stop: 100 * time.Millisecond, Finished: true},
		{Row: "1024 MiB, rewriting 256 MiB 1x, 15s", Policy: "lifeboat", InTime: 1, Runs: 1, Stop: 4500 * time.Millisecond, Finished: true},
	}
	if len(cells) != len(want) {
		t.Fatalf("%d cells, want %d: %+v", len(cells), len(want), cells)
	}
	for i := range want {
		if cells[i] != want[i] {
			t.Errorf("cell %d: %+v, want %+v", i, cells[i], want[i])
		}
	}
}

func TestParseBench(t *testing.T) {
	out := `goos: linux
BenchmarkMigrationNetworkInterruption-2   	       1	30000000000 ns/op	       125.0 downtime-ms	       704.0 interruption-ms	       579.0 added-ms
BenchmarkOther-2   	       1	1 ns/op	       1.0 interruption-ms
BenchmarkMigrationNetworkInterruption-2   	       1	30000000000 ns/op	        66.0 downtime-ms	       623.0 interruption-ms	       557.0 added-ms
`
	runs, err := ParseBench(strings.NewReader(out), "BenchmarkMigrationNetworkInterruption")
	if err != nil {
		t.Fatal(err)
	}
	got := NetworkRuns(runs)
	want := []Interruption{{"1", 704 * time.Millisecond, 0, 125 * time.Millisecond}, {"2", 623 * time.Millisecond, 0, 66 * time.Millisecond}}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("runs %+v, want %+v", got, want)
	}
}
