package main

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/lifeboat-vm/lifeboat/test/guest/protocol"
	"github.com/lifeboat-vm/lifeboat/test/node"
)

// ask connects to the Service ns/name from the pod network, as a client on a node would, and
// prints the guest's answer. With every > 0 it asks that often until ctx ends, each request on
// its own with a one-second timeout, and then prints what it saw: the answers, the boots they
// came from, and the longest time without one.
func ask(ctx context.Context, dir, ref string, every time.Duration) error {
	ns, name, ok := strings.Cut(ref, "/")
	if !ok {
		return fmt.Errorf("ask wants NAMESPACE/SERVICE, not %q", ref)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(dir, "admin.kubeconfig"))
	if err != nil {
		return err
	}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	svc, err := kube.CoreV1().Services(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	if len(svc.Spec.Ports) == 0 || svc.Spec.ClusterIP == "" || svc.Spec.ClusterIP == "None" {
		return fmt.Errorf("service %s has no cluster IP and port to ask", ref)
	}
	root, err := readNodesRoot(dir)
	if err != nil {
		return err
	}
	network, err := node.OpenNetwork(filepath.Join(root, networkDir))
	if err != nil {
		return err
	}
	address := net.JoinHostPort(svc.Spec.ClusterIP, fmt.Sprint(svc.Spec.Ports[0].Port))
	once := func() (string, error) {
		line, err := network.AskLine(context.Background(), address, time.Second)
		return strings.TrimSpace(line), err
	}
	if every <= 0 {
		line, err := once()
		if err != nil {
			return fmt.Errorf("asking %s (service %s): %w", address, ref, err)
		}
		fmt.Printf("%s answers: %s\n", ref, line)
		return nil
	}
	type result struct {
		at   time.Time
		line string
		err  error
	}
	var mu sync.Mutex
	var results []result
	var wg sync.WaitGroup
	tick := time.NewTicker(every)
	defer tick.Stop()
	fmt.Printf("asking %s (service %s) every %s\n", address, ref, every)
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case <-tick.C:
		}
		wg.Go(func() {
			line, err := once()
			mu.Lock()
			results = append(results, result{at: time.Now(), line: line, err: err})
			mu.Unlock()
		})
	}
	wg.Wait()
	answered, boots := 0, map[string]bool{}
	var last, gapFrom, gapTo time.Time
	var first, latest int
	for _, r := range results {
		boot, counter, err := protocol.ParseAnswer(r.line)
		if r.err != nil || err != nil {
			continue
		}
		if answered == 0 {
			first = counter
		}
		answered, latest, boots[boot] = answered+1, counter, true
		if !last.IsZero() && r.at.Sub(last) > gapTo.Sub(gapFrom) {
			gapFrom, gapTo = last, r.at
		}
		last = r.at
	}
	fmt.Printf("%d requests, %d answered, from %d boot(s) of the guest, counter %d to %d; longest time without an answer %s (%s to %s)\n",
		len(results), answered, len(boots), first, latest, gapTo.Sub(gapFrom).Round(time.Millisecond),
		gapFrom.Format("15:04:05.000"), gapTo.Format("15:04:05.000"))
	return nil
}
