// Command lifeboat-graceprobe is the container of the real node's eviction test: it records, in
// a file on a hostPath volume, when it started, a heartbeat every 100 ms, and when SIGTERM came.
// It ignores SIGTERM, so the last heartbeat shows when the kubelet's SIGKILL ended it: the grace
// period the container was given is the time between the two.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	out := flag.String("out", "/probe/events", "the file to append events to")
	flag.Parse()
	f, err := os.OpenFile(*out, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	record := func(event string) { fmt.Fprintf(f, "%s %d\n", event, time.Now().UnixNano()) }
	record("start")
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM)
	beat := time.NewTicker(100 * time.Millisecond)
	for {
		select {
		case <-signals:
			record("sigterm")
		case <-beat.C:
			record("beat")
		}
	}
}
