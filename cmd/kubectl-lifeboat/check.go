package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/lifeboat-vm/lifeboat/evacuation/check"
)

// errChecksFailed ends a check that found failures: the report has said what they are.
var errChecksFailed = errors.New("checks failed")

// runCheck runs every check of the cluster and prints the report, as text or JSON; it returns
// errChecksFailed when a check failed.
func runCheck(ctx context.Context, clients check.Clients, opts check.Options, output string, out io.Writer, now time.Time) error {
	report, err := check.Run(ctx, clients, opts, now)
	if err != nil {
		return err
	}
	switch output {
	case "json":
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		err = enc.Encode(struct {
			check.Report
			Failed bool `json:"failed"`
		}{report, report.Failed()})
	default:
		err = printReport(out, report)
	}
	if err != nil {
		return err
	}
	if report.Failed() {
		return errChecksFailed
	}
	return nil
}

// printReport writes a line per check, status first, and what to do on the next line.
func printReport(out io.Writer, report check.Report) error {
	var b strings.Builder
	for _, r := range report.Results {
		fmt.Fprintf(&b, "%-7s %s: %s\n", label(r.Status), r.Check, r.Message)
		if r.Fix != "" {
			fmt.Fprintf(&b, "%-7s   fix: %s\n", "", r.Fix)
		}
	}
	fmt.Fprintf(&b, "%d ok, %d warn, %d fail, %d unknown\n", report.Count(check.OK), report.Count(check.Warn), report.Count(check.Fail), report.Count(check.Unknown))
	_, err := io.WriteString(out, b.String())
	return err
}

// label makes failures stand out in a column of statuses.
func label(s check.Status) string {
	if s == check.Fail {
		return "FAIL"
	}
	return string(s)
}
