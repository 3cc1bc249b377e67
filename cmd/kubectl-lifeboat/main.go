// Command kubectl-lifeboat is a kubectl plugin (`kubectl lifeboat`) for lifeboat's VMs:
//
//	kubectl lifeboat start VM            start a VM (Halted becomes Always; a Manual VM gets its instance)
//	kubectl lifeboat stop VM             stop it (Always, RerunOnFailure, Once become Halted; a Manual VM's instance goes)
//	kubectl lifeboat restart VM          make its instance again (Always, RerunOnFailure)
//	kubectl lifeboat migrate VM          live-migrate it now (a migration with cause Manual)
//	kubectl lifeboat evacuate-cancel VM  cancel its evacuation (needs the cancel-evacuation permission)
//	kubectl lifeboat status VM           the VM, its instance and its evacuation story
//	kubectl lifeboat console VM          the guest's serial console (Ctrl+] leaves; needs pods/exec)
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
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	lifeboatclient "github.com/lifeboat-vm/lifeboat/api/client/clientset/versioned"
)

const usage = `usage: kubectl lifeboat COMMAND VM [-n NAMESPACE] [--kubeconfig FILE] [--context NAME] [--as USER]

commands:
  start            start the VM
  stop             stop the VM (its guest shuts down gracefully)
  restart          make the VM's instance again
  migrate          live-migrate the VM to another node now
  evacuate-cancel  cancel the VM's evacuation from its node
  status           show the VM, its instance and its evacuation story
  console          connect to the VM's serial console (Ctrl+] leaves; needs create on pods/exec)
`

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
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
	if err := flags.Parse(args); err != nil {
		return err
	}
	if flags.NArg() != 2 {
		flags.Usage()
		return errors.New("want a command and a VM's name")
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
	c := &client{lb: lb, kube: kube, namespace: namespace, out: out}
	if command == "console" {
		// A session lasts as long as its user wants.
		return c.console(context.Background(), rest, name, os.Stdin, os.Stderr)
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
		return c.migrate(ctx, name)
	case "evacuate-cancel":
		return c.cancelEvacuation(ctx, name)
	case "status":
		return c.status(ctx, name, time.Now())
	}
	flags.Usage()
	return fmt.Errorf("unknown command %q", command)
}
