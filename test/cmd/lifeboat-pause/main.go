// Command lifeboat-pause is the sandbox ("pause") container of the real test node: it holds the
// pod's namespaces open until the runtime stops it. The real node cannot pull registry.k8s.io's
// pause image (there is no registry here), so it runs this one, built locally and imported.
//
// Like the upstream pause it exits 0 on SIGINT or SIGTERM and reaps the zombies of pods that
// share their PID namespace, which it is process 1 of.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range signals {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
