// Command lifeboat-images builds lifeboat's container images without a registry, as OCI image
// layout tarballs that `ctr -n k8s.io images import` loads (see test/images):
//
//	go run ./test/cmd/lifeboat-images build -out DIR
//
// writes DIR/lifeboat-agent.oci.tar, DIR/lifeboat-controller.oci.tar and
// DIR/lifeboat-launcher.oci.tar, named lifeboat.dev/<name>:dev.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/lifeboat-vm/lifeboat/test/images"
)

func main() {
	if len(os.Args) < 2 || os.Args[1] != "build" {
		fmt.Fprintln(os.Stderr, "usage: lifeboat-images build -out DIR")
		os.Exit(2)
	}
	fs := flag.NewFlagSet("build", flag.ExitOnError)
	out := fs.String("out", "", "directory for the <name>.oci.tar archives (created if missing)")
	_ = fs.Parse(os.Args[2:])
	if *out == "" || fs.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "usage: lifeboat-images build -out DIR")
		os.Exit(2)
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	if err := images.Build(ctx, *out, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "lifeboat-images:", err)
		os.Exit(1)
	}
}
