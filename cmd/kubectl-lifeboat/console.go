package main

import (
	"context"
	"fmt"
	"io"
	"os"

	"golang.org/x/term"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"
	"k8s.io/streaming/pkg/httpstream"

	contract "github.com/lifeboat-vm/lifeboat/api/launcher"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/evacuation/vmi"
)

// console connects the terminal to the serial console of the VM's (or VMI's) guest: it runs
// `lifeboat-launcher console` in the launcher pod through pods/exec, so the caller needs no
// more than the namespace's own permission to exec into its pods, and nothing reaches the
// node. Ctrl+] or the end of stdin leaves. The guest's output reaches the terminal through
// termFilter unless raw: the guest is the VM owner's, the terminal may be a cluster admin's.
func (c *client) console(ctx context.Context, config *rest.Config, name string, in *os.File, errOut io.Writer, raw bool) error {
	i, err := c.lb.LifeboatV1alpha1().VirtualMachineInstances(c.namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("VM %s/%s has no instance running (kubectl lifeboat start %s starts a stopped VM)", c.namespace, name, name)
	}
	if err != nil {
		return fmt.Errorf("reading the instance of VM %s/%s: %w", c.namespace, name, err)
	}
	if i.Status.Phase != v1alpha1.VMIRunning {
		return fmt.Errorf("VM %s/%s is %s, not Running: its console opens once the guest runs", c.namespace, name, phaseOrNone(i.Status.Phase))
	}
	pod, err := c.launcherPod(ctx, i)
	if err != nil {
		return err
	}
	if err := c.mayExec(ctx, pod, name); err != nil {
		return err
	}
	tty := term.IsTerminal(int(in.Fd()))
	req := c.kube.CoreV1().RESTClient().Post().Resource("pods").Namespace(pod.Namespace).Name(pod.Name).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{
			Container: contract.ContainerName, Command: []string{contract.Command, "console"},
			Stdin: true, Stdout: true, Stderr: true, TTY: tty,
		}, scheme.ParameterCodec)
	exec, err := executor(config, req)
	if err != nil {
		return err
	}
	if tty {
		old, err := term.MakeRaw(int(in.Fd()))
		if err != nil {
			return fmt.Errorf("putting the terminal in raw mode: %w", err)
		}
		defer func() { _ = term.Restore(int(in.Fd()), old) }()
	}
	fmt.Fprintf(errOut, "connecting to the serial console of VM %s/%s (pod %s on node %s); Ctrl+] leaves\r\n", c.namespace, name, pod.Name, pod.Spec.NodeName)
	out, stderr := c.out, errOut
	if !raw {
		out, stderr = newTermFilter(out), newTermFilter(stderr)
	}
	err = exec.StreamWithContext(ctx, remotecommand.StreamOptions{Stdin: in, Stdout: out, Stderr: stderr, Tty: tty})
	if err != nil {
		return fmt.Errorf("the console of VM %s/%s (pod %s): %w", c.namespace, name, pod.Name, err)
	}
	return nil
}

// launcherPod is the pod the VMI's guest runs in now.
func (c *client) launcherPod(ctx context.Context, i *v1alpha1.VirtualMachineInstance) (*corev1.Pod, error) {
	pods, err := c.kube.CoreV1().Pods(i.Namespace).List(ctx, metav1.ListOptions{LabelSelector: v1alpha1.LabelVMIUID + "=" + string(i.UID)})
	if apierrors.IsForbidden(err) {
		return nil, fmt.Errorf("you may not list the pods of VM %s/%s, which the console needs: %w", i.Namespace, i.Name, err)
	}
	if err != nil {
		return nil, fmt.Errorf("listing the pods of VM %s/%s: %w", i.Namespace, i.Name, err)
	}
	owned := make([]*corev1.Pod, 0, len(pods.Items))
	for k := range pods.Items {
		if metav1.IsControlledBy(&pods.Items[k], i) {
			owned = append(owned, &pods.Items[k])
		}
	}
	if p := vmi.ActivePod(i, owned); p != nil && !vmi.PodEnded(p) {
		return p, nil
	}
	return nil, fmt.Errorf("VM %s/%s has no launcher pod running on node %s", i.Namespace, i.Name, i.Status.NodeName)
}

// executor streams over WebSockets, and over SPDY where the API server or a proxy in between
// cannot upgrade to WebSockets, as kubectl exec does.
func executor(config *rest.Config, req *rest.Request) (remotecommand.Executor, error) {
	ws, err := remotecommand.NewWebSocketExecutor(config, "GET", req.URL().String())
	if err != nil {
		return nil, err
	}
	spdy, err := remotecommand.NewSPDYExecutor(config, "POST", req.URL())
	if err != nil {
		return nil, err
	}
	return remotecommand.NewFallbackExecutor(ws, spdy, func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	})
}

// mayExec asks the API server whether the caller may exec into the pod, so that a refusal says
// which permission it takes (the streaming upgrade's own refusal reaches client-go as text).
func (c *client) mayExec(ctx context.Context, pod *corev1.Pod, name string) error {
	review, err := c.kube.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{
		Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{
			Namespace: pod.Namespace, Verb: "create", Resource: "pods", Subresource: "exec", Name: pod.Name,
		}},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("asking whether you may open the console of VM %s/%s: %w", c.namespace, name, err)
	}
	if !review.Status.Allowed {
		return fmt.Errorf("you may not open the console of VM %s/%s: it takes create on pods/exec in namespace %s (kubectl auth can-i create pods --subresource=exec -n %s says no)",
			c.namespace, name, c.namespace, c.namespace)
	}
	return nil
}

func phaseOrNone(p v1alpha1.VirtualMachineInstancePhase) string {
	if p == "" {
		return "not scheduled yet"
	}
	return string(p)
}
