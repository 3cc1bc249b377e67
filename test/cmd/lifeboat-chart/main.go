// Command lifeboat-chart draws a benchmark's chart again from its recorded raw output, read on
// standard input, as SVG on standard output (the benchmarks draw their own as they run):
//
//	lifeboat-chart matrix  < deadline.txt > deadline-matrix.svg    # BenchmarkDeadlineMatrix's table
//	lifeboat-chart network < network.txt  > network.svg            # BenchmarkMigrationNetworkInterruption's lines
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"

	"github.com/lifeboat-vm/lifeboat/test/internal/chart"
)

func main() {
	title := flag.String("title", "", "the chart's title (a default names the benchmark)")
	flag.Parse()
	if err := run(flag.Arg(0), *title); err != nil {
		fmt.Fprintln(os.Stderr, "lifeboat-chart:", err)
		os.Exit(1)
	}
}

func run(kind, title string) error {
	switch kind {
	case "matrix":
		cells, err := chart.ParseMatrix(os.Stdin)
		if err != nil {
			return err
		}
		if len(cells) == 0 {
			return errors.New("no row of the deadline matrix's table on standard input")
		}
		return chart.Matrix(os.Stdout, or(title, "Deadline matrix: runs in time and the guest's stop at the switch (median)"), cells)
	case "network":
		runs, err := chart.ParseBench(os.Stdin, "BenchmarkMigrationNetworkInterruption")
		if err != nil {
			return err
		}
		if len(runs) == 0 {
			return errors.New("no BenchmarkMigrationNetworkInterruption line on standard input")
		}
		return chart.Interruptions(os.Stdout, or(title, "Network interruption during a migration"), chart.NetworkRuns(runs))
	}
	return fmt.Errorf("draw what? %q: matrix or network", kind)
}

func or(s, otherwise string) string {
	if s == "" {
		return otherwise
	}
	return s
}
