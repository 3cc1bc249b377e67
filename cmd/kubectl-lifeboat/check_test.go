package main

import (
	"strings"
	"testing"

	"github.com/lifeboat-vm/lifeboat/evacuation/check"
)

// A report reads as a column of statuses, failures in capitals, each fix under its line, and a count.
func TestCheckPrintReport(t *testing.T) {
	var out strings.Builder
	err := printReport(&out, check.Report{Results: []check.Result{
		{Check: "controller", Status: check.OK, Message: "replica-a leads"},
		{Check: "agent on node b", Status: check.Fail, Message: "no ready agent", Fix: "kubectl -n lifeboat-system get pods"},
		{Check: "webhook authentication", Status: check.Unknown, Message: "not recorded"},
	}})
	want := "ok      controller: replica-a leads\n" +
		"FAIL    agent on node b: no ready agent\n" +
		"          fix: kubectl -n lifeboat-system get pods\n" +
		"unknown webhook authentication: not recorded\n" +
		"1 ok, 0 warn, 1 fail, 1 unknown\n"
	if err != nil || out.String() != want {
		t.Errorf("printReport: %v\n%s\nwant\n%s", err, out.String(), want)
	}
}
