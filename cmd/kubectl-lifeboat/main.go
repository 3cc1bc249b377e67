// Command kubectl-lifeboat is a kubectl plugin (`kubectl lifeboat`) for lifeboat's VMs:
//
//	kubectl lifeboat start VM            start a VM (Halted becomes Always; a Manual VM gets its instance)
//	kubectl lifeboat stop VM             stop it (Always, RerunOnFailure, Once become Halted; a Manual VM's instance goes)
//	kubectl lifeboat restart VM          make its instance again (Always, RerunOnFailure)
//	kubectl lifeboat migrate VM          live-migrate it now (a migration with cause Manual);
//	                                     --wait follows it as follow does
//	kubectl lifeboat follow VM           follow its running or next migration live, until the guest
//	                                     runs on the target or the migration fails (exit 1), or --timeout
//	kubectl lifeboat evacuate-cancel VM  cancel its evacuation (needs the cancel-evacuation permission)
//	kubectl lifeboat status VM           the VM, its instance, what protects it, what a drain or memory
//	                                     pressure on its node would do to it, and its evacuation story
//	kubectl lifeboat console VM          the guest's serial console (Ctrl+] leaves; needs pods/exec);
//	                                     --raw passes the guest's escape sequences to the terminal unfiltered
//	kubectl lifeboat check [-o json]     check that lifeboat can protect the cluster's VMs (exit 1 if not);
//	                                     -n limits the checks of VMs and migrations to a namespace
//
// Flags (before or after the command): --kubeconfig, --context, -n/--namespace, --as, as kubectl's.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/pflag"
	apiextensions "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	lifeboatclient "github.com/lifeboat-vm/lifeboat/api/client/clientset/versioned"
	"github.com/lifeboat-vm/lifeboat/evacuation/check"
)

const usage = `usage: kubectl lifeboat COMMAND VM [-n NAMESPACE] [--kubeconfig FILE] [--context NAME] [--as USER]
       kubectl lifeboat migrate VM [--wait] [--timeout DURATION]
       kubectl lifeboat follow VM [--timeout DURATION]
       kubectl lifeboat check [-o json] [--stuck-after DURATION] [-n NAMESPACE]

commands:
  start            start the VM
  stop             stop the VM (its guest shuts down gracefully)
  restart          make the VM's instance again
  migrate          live-migrate the VM to another node now (--wait: then follow the migration)
  follow           follow the VM's running or next migration: phase, mode, bytes left, rates and
                   the time to its deadline, redrawn in place on a terminal and a line per change
                   when piped; then where the VM runs, how long it took and how long the guest
                   stood still; exit status 1 if the migration fails or --timeout passes first
  evacuate-cancel  cancel the VM's evacuation from its node
  status           show the VM, its instance, what protects it now, what a drain or memory
                   pressure on its node would do to it, and its evacuation story
  console          connect to the VM's serial console (Ctrl+] leaves; needs create on pods/exec);
                   the guest's escape sequences that could act on your terminal rather than draw
                   (window titles, the clipboard) are dropped unless --raw
  check            check the installation and what protects each node's VMs, a line per check;
                   exit status 1 if any fails (-o json for scripts; -n: only that namespace's VMs)
`

func main() {
	err := run(os.Args[1:], os.Stdout)
	if errors.Is(err, errChecksFailed) || errors.Is(err, errMigrationFailed) {
		os.Exit(1)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}

func run(args []string, out io.Writer) error {
	flags := pflag.NewFlagSet("kubectl lifeboat", pflag.ContinueOnError)
	flags.Usage = func() { fmt.Fprint(os.Stderr, usage) }
	overrides := &clientcmd.ConfigOverrides{}
	kubeconfig := flags.String("kubeconfig", "", "the kubeconfig file")
	flags.StringVar(&overrides.CurrentContext, "context", "", "the kubeconfig context")
	flags.StringVarP(&overrides.Context.Namespace, "namespace", "n", "", "the VM's namespace")
	flags.StringVar(&overrides.AuthInfo.Impersonate, "as", "", "the user to act as")
	output := flags.StringP("output", "o", "text", "check's output: text or json")
	stuckAfter := flags.Duration("stuck-after", 15*time.Minute, "check: how long a migration may run before it counts as stuck")
	raw := flags.Bool("raw", false, "console: pass the guest's output to the terminal as it is, escape sequences and all")
	wait := flags.Bool("wait", false, "migrate: follow the migration until it ends, as follow does")
	timeout := flags.Duration("timeout", 15*time.Minute, "follow, migrate --wait: how long to follow before giving up (exit 1)")
	if err := flags.Parse(args); err != nil {
		return err
	}
	isCheck := flags.Arg(0) == "check"
	if isCheck && flags.NArg() != 1 {
		flags.Usage()
		return errors.New("check takes no VM name (-n limits it to a namespace's VMs)")
	}
	if *stuckAfter <= 0 {
		return fmt.Errorf("--stuck-after=%s: want a positive duration", *stuckAfter)
	}
	if *timeout <= 0 {
		return fmt.Errorf("--timeout=%s: want a positive duration", *timeout)
	}
	if !isCheck && flags.NArg() != 2 {
		flags.Usage()
		return errors.New("want a command and a VM's name")
	}
	if *output != "text" && *output != "json" {
		return fmt.Errorf("-o %q: want text or json", *output)
	}
	command, name := flags.Arg(0), flags.Arg(1)
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = *kubeconfig
	config := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, overrides)
	namespace, _, err := config.Namespace()
	if err != nil {
		return err
	}
	rest, err := config.ClientConfig()
	if err != nil {
		return err
	}
	lb, err := lifeboatclient.NewForConfig(rest)
	if err != nil {
		return err
	}
	kube, err := kubernetes.NewForConfig(rest)
	if err != nil {
		return err
	}
	if isCheck {
		// Cluster-wide unless -n names a namespace: the kubeconfig's default is not a choice.
		scope := ""
		if flags.Changed("namespace") {
			scope = namespace
		}
		ext, err := apiextensions.NewForConfig(rest)
		if err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		return runCheck(ctx, check.Clients{Kube: kube, Lifeboat: lb, Extensions: ext},
			check.Options{StuckAfter: *stuckAfter, NodeTimeout: 5 * time.Second, Namespace: scope}, *output, out, time.Now())
	}
	c := &client{lb: lb, kube: kube, namespace: namespace, out: out}
	if command == "console" {
		// A session lasts as long as its user wants.
		return c.console(context.Background(), rest, name, os.Stdin, os.Stderr, *raw)
	}
	if command == "follow" {
		return c.follow(context.Background(), name, "", *timeout)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	switch command {
	case "start":
		return c.start(ctx, name)
	case "stop":
		return c.stop(ctx, name)
	case "restart":
		return c.restart(ctx, name)
	case "migrate":
		migration, err := c.migrate(ctx, name, !*wait)
		if err != nil || !*wait {
			return err
		}
		return c.follow(context.Background(), name, migration, *timeout)
	case "evacuate-cancel":
		return c.cancelEvacuation(ctx, name)
	case "status":
		return c.status(ctx, name, time.Now())
	}
	flags.Usage()
	return fmt.Errorf("unknown command %q", command)
}
