// Package check is `kubectl lifeboat check`: what an admin needs to know of a cluster before
// lifeboat can keep its VMs alive, one line per check. Gathering reads the API server
// (gather.go); each line is decided by a pure function of what was read and of now (decide.go).
package check

import "slices"

// Status is a check's outcome.
type Status string

const (
	// OK: nothing to do.
	OK Status = "ok"
	// Warn: lifeboat works, but something puts VMs at risk or costs protection.
	Warn Status = "warn"
	// Fail: lifeboat cannot do its job somewhere; the command exits 1.
	Fail Status = "fail"
	// Unknown: the API server does not show what the check needs (said so rather than guessed).
	Unknown Status = "unknown"
)

// Result is one line of the report.
type Result struct {
	// Check names what is checked, e.g. "controller" or "node worker-1 eviction".
	Check   string `json:"check"`
	Status  Status `json:"status"`
	Message string `json:"message"`
	// Fix says what to do; empty when there is nothing to do.
	Fix string `json:"fix,omitempty"`
}

// Report is every check's result, in the order they ran.
type Report struct {
	Results []Result `json:"results"`
}

// Failed says whether any check failed.
func (r Report) Failed() bool {
	return slices.ContainsFunc(r.Results, func(res Result) bool { return res.Status == Fail })
}

// Count is how many results have status s.
func (r Report) Count(s Status) int {
	n := 0
	for _, res := range r.Results {
		if res.Status == s {
			n++
		}
	}
	return n
}
