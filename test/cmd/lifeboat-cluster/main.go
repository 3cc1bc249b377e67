// Command lifeboat-cluster runs lifeboat's local control plane outside the tests: for make demo,
// and for anyone who wants a real API server with lifeboat's CRDs to poke at.
//
//	lifeboat-cluster build              build and cache the control plane binaries
//	lifeboat-cluster up --dir DIR       start a control plane in the background, wait until ready;
//	    --nodes N --lifeboat-bin BIN    also N emulated nodes with an agent each, and the controller
//	    --nodes-root DIR                 the nodes' host paths (default /tmp/lifeboat-demo)
//	lifeboat-cluster down --dir DIR     stop it and remove DIR
//	lifeboat-cluster bin-dir            print the directory holding kubectl and the other binaries
//	lifeboat-cluster guest              print the test guest's kernel and initrd (built once, cached)
//	lifeboat-cluster console NS/NAME    print a demo VMI's guest console [--wait-for LINE]
//	lifeboat-cluster evict NS/NAME      have a VMI's node evict its pod for memory pressure, as a kubelet would
//	lifeboat-cluster follow NS/NAME     print the VMI's migrations as they progress until it runs elsewhere,
//	    --nodes-only                     then what its nodes show: the guest's console goes on, the source
//	                                     launcher ends; --nodes-only prints that alone (make demo has
//	                                     kubectl lifeboat follow show the migration)
//	lifeboat-cluster ask NS/SERVICE     ask a Service of a demo VM from the pod network and print the answer;
//	    --every D                        ask every D until interrupted, then print what was seen
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"k8s.io/apimachinery/pkg/util/wait"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/lifeboat-vm/lifeboat/test/controlplane"
	"github.com/lifeboat-vm/lifeboat/test/guest"
	"github.com/lifeboat-vm/lifeboat/test/node"
)

const (
	pidFile   = "serve.pid"
	readyFile = "ready"
	errorFile = "error"
	logFile   = "serve.log"
)

func main() {
	// Emulated nodes run each container under a re-execution of this binary.
	node.MaybeRunShim()
	if len(os.Args) < 2 {
		usage()
	}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	dir := fs.String("dir", ".demo/cluster", "directory for the control plane's files")
	timeout := fs.Duration("timeout", 30*time.Minute, "how long up (or console --wait-for) waits; up's includes the first build")
	var lb lifeboatOptions
	fs.IntVar(&lb.nodes, "nodes", 0, "emulated nodes to start, each with a lifeboat agent; with any, the controller runs too")
	fs.StringVar(&lb.bin, "lifeboat-bin", "bin", "directory holding lifeboat-agent, lifeboat-controller and lifeboat-launcher")
	fs.StringVar(&lb.acceleration, "acceleration", "auto", "guest acceleration: kvm, tcg or auto")
	fs.StringVar(&lb.nodesRoot, "nodes-root", defaultNodesRoot, "directory of the emulated nodes' host paths; keep it short (unix socket paths live under it)")
	waitFor := fs.String("wait-for", "", "console: wait until the guest printed this line")
	every := fs.Duration("every", 0, "ask: ask this often until interrupted (SIGINT or SIGTERM), then summarise")
	nodesOnly := fs.Bool("nodes-only", false, "follow: print only what the nodes show (the guest's console, the source launcher's end), not the migration's lines")
	args := os.Args[2:]
	var ref string
	if (os.Args[1] == "console" || os.Args[1] == "evict" || os.Args[1] == "follow" || os.Args[1] == "ask") && len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		ref, args = args[0], args[1:]
	}
	_ = fs.Parse(args)
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()

	var err error
	switch os.Args[1] {
	case "build":
		if _, err = controlplane.EnsureBinaries(ctx, os.Stderr); err == nil {
			_, err = controlplane.EnsureKubeProxy(ctx, os.Stderr)
		}
	case "ask":
		err = ask(ctx, *dir, ref, *every)
	case "bin-dir":
		var bins controlplane.Binaries
		if bins, err = controlplane.EnsureBinaries(ctx, os.Stderr); err == nil {
			fmt.Println(bins.Dir())
		}
	case "up":
		err = up(ctx, *dir, *timeout, lb)
	case "serve":
		err = serve(ctx, *dir, lb)
	case "guest":
		var img guest.Image
		if img, err = guest.Ensure(ctx, os.Stderr); err == nil {
			fmt.Println(img.Kernel, img.Initrd)
		}
	case "console":
		err = console(ctx, *dir, ref, *waitFor, *timeout)
	case "evict":
		err = evict(ctx, *dir, ref)
	case "follow":
		err = follow(ctx, *dir, ref, *timeout, *nodesOnly)
	case "down":
		err = down(*dir)
	case "rights":
		err = rights(ctx)
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "lifeboat-cluster %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: lifeboat-cluster build | bin-dir | guest | up [--dir DIR] [--nodes N --lifeboat-bin BIN] | down [--dir DIR] | console NS/NAME [--wait-for LINE] | evict NS/NAME | follow NS/NAME [--nodes-only] | ask NS/SERVICE [--every D] | rights")
	os.Exit(2)
}

// up starts serve detached from this process (own session, output to a log file) so the
// cluster outlives the make target that started it, then waits until serve says it is ready.
func up(ctx context.Context, dir string, timeout time.Duration, lb lifeboatOptions) error {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	if pid, err := readPID(dir); err == nil && syscall.Kill(pid, 0) == nil {
		return fmt.Errorf("a control plane already runs from %s (pid %d); run lifeboat-cluster down --dir %s first", dir, pid, dir)
	}
	// Build in the foreground so the first run shows its progress.
	if _, err := controlplane.EnsureBinaries(ctx, os.Stderr); err != nil {
		return err
	}
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	log, err := os.Create(dir + "." + logFile)
	if err != nil {
		return err
	}
	defer log.Close()
	bin, err := filepath.Abs(lb.bin)
	if err != nil {
		return err
	}
	cmd := exec.Command(self, "serve", "--dir", dir, "--nodes", strconv.Itoa(lb.nodes), "--lifeboat-bin", bin,
		"--acceleration", lb.acceleration, "--nodes-root", lb.nodesRoot)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		if _, err := os.Stat(filepath.Join(dir, readyFile)); err == nil {
			return true, nil
		}
		if b, err := os.ReadFile(dir + "." + errorFile); err == nil {
			return false, errors.New(string(b))
		}
		return false, nil
	})
	if err != nil {
		_ = cmd.Process.Kill()
		return fmt.Errorf("the control plane did not become ready within %s (see %s): %w", timeout, log.Name(), err)
	}
	fmt.Printf("control plane ready: export KUBECONFIG=%s\n", filepath.Join(dir, "admin.kubeconfig"))
	return cmd.Process.Release()
}

// serve runs the control plane in the foreground until SIGTERM or SIGINT.
func serve(ctx context.Context, dir string, lb lifeboatOptions) error {
	_ = os.Remove(dir + "." + errorFile)
	fail := func(err error) error {
		_ = os.WriteFile(dir+"."+errorFile, []byte(err.Error()), 0o644)
		return err
	}
	cp, err := controlplane.Start(ctx, controlplane.Options{Dir: dir, Progress: os.Stderr})
	if err != nil {
		return fail(err)
	}
	defer cp.Stop()
	if lb.nodes > 0 {
		nodes, stop, err := startLifeboat(ctx, cp, lb)
		if err != nil {
			return fail(err)
		}
		defer stop()
		stopControl, err := serveControl(ctx, dir, nodes)
		if err != nil {
			return fail(err)
		}
		defer stopControl()
	}
	if err := os.WriteFile(filepath.Join(dir, pidFile), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, readyFile), nil, 0o644); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "serving %s; stop with SIGTERM\n", cp.Host)
	<-ctx.Done()
	return nil
}

// down stops the serve process of dir and waits until it has removed its files.
func down(dir string) error {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	pid, err := readPID(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			fmt.Printf("no control plane runs from %s\n", dir)
			return nil
		}
		return err
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil && !errors.Is(err, syscall.ESRCH) {
		return err
	}
	err = wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return syscall.Kill(pid, 0) != nil, nil
	})
	if err != nil {
		return fmt.Errorf("pid %d did not stop within 30s", pid)
	}
	_ = os.RemoveAll(dir)
	fmt.Printf("control plane in %s stopped\n", dir)
	return nil
}

func readPID(dir string) (int, error) {
	b, err := os.ReadFile(filepath.Join(dir, pidFile))
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}
