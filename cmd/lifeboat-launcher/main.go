// Command lifeboat-launcher is the main process of a VM pod. Its exit code says how the VM
// ended (see api/launcher): 0 powered off, 1 launcher failure, 2 destroyed, 3 crashed.
//
// `lifeboat-launcher console`, run in the pod (`kubectl lifeboat console` does it through
// pods/exec), connects the caller's stdin and stdout to the guest's serial console.
//
// `lifeboat-launcher probe-qemu --out FILE --stay`, the one container of the QEMU probe's pods
// (manifests/qemu-probe.yaml), writes what the node's QEMU can do, for the node's agent to give
// each new launcher, and then waits for its pod to end. It exits 1 when it cannot probe, so that
// the kubelet tries again and the pod shows it.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	contract "github.com/lifeboat-vm/lifeboat/api/launcher"
	"github.com/lifeboat-vm/lifeboat/domain"
	"github.com/lifeboat-vm/lifeboat/launcher"
	"github.com/lifeboat-vm/lifeboat/launcher/vmdisks"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "console" {
		if err := launcher.Console(contract.PodRunDir, os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "lifeboat-launcher console:", err)
			os.Exit(1)
		}
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "probe-qemu" {
		probeQEMU(os.Args[2:])
		return
	}
	runDir := flag.String("run-dir", contract.PodRunDir, "where the pod mounts its run volume, which the agent reaches too")
	accel := flag.String("acceleration", "auto", "kvm, tcg, or auto (KVM only after a probe boot proves it works)")
	flag.Parse()

	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	// Listen before anything else: a SIGTERM during start-up must not kill the launcher.
	sigterm := make(chan os.Signal, 4)
	signal.Notify(sigterm, syscall.SIGTERM, syscall.SIGINT)

	cfg, err := launcher.ConfigFromEnv(os.Getenv)
	if err == nil {
		cfg.Acceleration, err = domain.ParseAcceleration(*accel)
	}
	if err != nil {
		log.Error("bad launcher configuration", "err", err)
		os.Exit(contract.ExitFailed)
	}
	cfg.RunDir, cfg.Log = *runDir, log
	cfg.Disks = vmdisks.Dirs{KernelBoot: contract.KernelBootDir, ContainerDisks: contract.ContainerDisksDir, State: contract.StateDir, Claims: contract.ClaimsDir, ClaimDevices: contract.ClaimDevicesDir, Secrets: contract.SecretsDir}
	os.Exit(launcher.Run(context.Background(), cfg, sigterm))
}

func probeQEMU(args []string) {
	fs := flag.NewFlagSet("probe-qemu", flag.ExitOnError)
	out := fs.String("out", "", "the file to write libvirt's QEMU capabilities cache to")
	stay := fs.Bool("stay", false, "once written, run until SIGTERM (a DaemonSet's container)")
	_ = fs.Parse(args)
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	sigterm := make(chan os.Signal, 1)
	signal.Notify(sigterm, syscall.SIGTERM, syscall.SIGINT)
	if *out == "" {
		log.Error("probe-qemu needs --out")
		os.Exit(contract.ExitFailed)
	}
	dir, err := os.MkdirTemp("", "probe-qemu")
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		start := time.Now()
		err = launcher.ProbeQEMU(ctx, dir, *out)
		cancel()
		_ = os.RemoveAll(dir)
		if err == nil {
			log.Info("probed QEMU", "out", *out, "took", time.Since(start).Round(time.Millisecond))
		}
	}
	if err != nil {
		log.Error("could not probe QEMU; until this probe succeeds every launcher on this node probes QEMU itself (0.3-0.6 s of its start)", "err", err)
		os.Exit(contract.ExitFailed)
	}
	if *stay {
		<-sigterm
	}
}
