// Command lifeboat-images builds lifeboat's container images without a container engine (see
// test/images), as OCI image layout tarballs that `ctr -n k8s.io images import` loads:
//
//	go run ./test/cmd/lifeboat-images build -out DIR
//
// writes DIR/lifeboat-agent.oci.tar, DIR/lifeboat-controller.oci.tar and
// DIR/lifeboat-launcher.oci.tar, named lifeboat.dev/<name>:dev; or pushed to a registry:
//
//	go run ./test/cmd/lifeboat-images push -registry REGISTRY -tag TAG
//
// pushes REGISTRY/lifeboat-{agent,controller,launcher}:TAG (what make push does), with the
// credentials of docker login; a registry on loopback is spoken to in plain HTTP.
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

const usage = "usage: lifeboat-images build -out DIR | push -registry REGISTRY -tag TAG"

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, usage)
		os.Exit(2)
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	var err error
	switch os.Args[1] {
	case "build":
		out := fs.String("out", "", "directory for the <name>.oci.tar archives (created if missing)")
		_ = fs.Parse(os.Args[2:])
		if *out == "" || fs.NArg() > 0 {
			fmt.Fprintln(os.Stderr, usage)
			os.Exit(2)
		}
		err = images.Build(ctx, *out, os.Stderr)
	case "push":
		registry := fs.String("registry", "", "where to push, host[:port][/path]")
		tag := fs.String("tag", "", "the images' tag")
		_ = fs.Parse(os.Args[2:])
		if *registry == "" || *tag == "" || fs.NArg() > 0 {
			fmt.Fprintln(os.Stderr, usage)
			os.Exit(2)
		}
		_, err = images.Push(ctx, *registry, *tag, os.Stderr)
	default:
		fmt.Fprintln(os.Stderr, usage)
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "lifeboat-images:", err)
		os.Exit(1)
	}
}
