package controlplane

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

// Runner runs a package's tests and returns the exit code, as *testing.M does.
type Runner interface{ Run() int }

// Main is a whole TestMain: it starts a control plane, stores it in *into, runs the tests,
// stops it and exits. Interrupting the tests (Ctrl-C) also stops it.
//
//	var cluster *controlplane.ControlPlane
//	func TestMain(m *testing.M) { controlplane.Main(m, &cluster, controlplane.Options{}) }
func Main(m Runner, into **ControlPlane, opts Options) {
	if opts.Progress == nil {
		opts.Progress = os.Stderr
	}
	cp, err := Start(context.Background(), opts)
	if err != nil {
		fmt.Fprintf(os.Stderr, "starting the local control plane: %v\n", err)
		os.Exit(1)
	}
	*into = cp
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-signals
		cp.Stop()
		os.Exit(130)
	}()
	code := m.Run()
	cp.Stop()
	os.Exit(code)
}
