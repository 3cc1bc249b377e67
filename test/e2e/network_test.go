package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/test/guest"
	"github.com/lifeboat-vm/lifeboat/test/guest/protocol"
	"github.com/lifeboat-vm/lifeboat/test/node"
)

// withPodNetwork gives v a card on the pod network with the masquerade binding, forwarding the
// guest's serving port.
func withPodNetwork(v *v1alpha1.VirtualMachineInstance) {
	v.Spec.Interfaces = []v1alpha1.Interface{{Name: "default", Masquerade: &v1alpha1.InterfaceMasquerade{},
		Ports: []v1alpha1.Port{{Name: "counter", Port: protocol.ServePort}}}}
	v.Spec.Networks = []v1alpha1.Network{{Name: "default", Pod: &v1alpha1.PodNetwork{}}}
}

// askGuest connects to address from the fabric, as a client on a node, and reads the guest's answer.
func askGuest(ctx context.Context, network *node.Network, address string) (boot string, counter int, err error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	c, err := network.DialContext(ctx, "tcp", address)
	if err != nil {
		return "", 0, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return "", 0, err
	}
	return protocol.ParseAnswer(line)
}

// launcherPodOn is v's launcher pod on node.
func launcherPodOn(t *testing.T, v *v1alpha1.VirtualMachineInstance, node string) *corev1.Pod {
	t.Helper()
	pods, err := cluster.Kube.CoreV1().Pods(v.Namespace).List(context.Background(), metav1.ListOptions{
		LabelSelector: v1alpha1.LabelVMIUID + "=" + string(v.UID), FieldSelector: "spec.nodeName=" + node})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("want one launcher pod for %s on %s: %v, %d pods", v.Name, node, err, len(pods.Items))
	}
	return &pods.Items[0]
}

// waitGuestAnswer asks address until the guest answers.
func waitGuestAnswer(t *testing.T, network *node.Network, address string, timeout time.Duration) (string, int) {
	t.Helper()
	var boot string
	var counter int
	var last error
	err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		boot, counter, last = askGuest(ctx, network, address)
		return last == nil, nil
	})
	if err != nil {
		t.Fatalf("the guest did not answer on %s within %s: %v", address, timeout, last)
	}
	return boot, counter
}

// A VM on the pod network gets its fixed address by DHCP from its pod, answers on its pod's
// address, and after a node-pressure live migration answers on the target pod's address, the
// same boot with its counter gone on: its card and address (behind the NAT) did not change.
func TestGuestOnThePodNetworkFollowsAMigration(t *testing.T) {
	const grace = 60
	setConfig(t, true)
	startController(t)
	network := node.NewTestNetwork(t)
	nodes := startNodes(t, 2, node.OnNetwork(network), func(c *node.Config) { c.EvictionMaxPodGracePeriod = grace })
	ns := testNamespace(t)
	vmi := createVMI(t, ns, newVMI("served", strategy(v1alpha1.EvictionStrategyLiveMigrate), withPodNetwork, func(v *v1alpha1.VirtualMachineInstance) {
		v.Spec.Memory = resource.MustParse("256Mi")
		v.Spec.TerminationGracePeriodSeconds = ptr.To[int64](grace)
	}))
	vmi = waitVMI(t, ns, vmi.Name, bootTimeout, "phase Running", running)
	source := nodeOf(t, nodes, vmi)
	mac, err := vmi.Spec.Interfaces[0].MAC(string(vmi.UID))
	if err != nil {
		t.Fatal(err)
	}
	wantLine := protocol.Network("10.0.2.2/24", "10.0.2.1", mac.String())
	ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
	defer cancel()
	if _, err := guest.WaitForLine(ctx, source.consolePath(vmi), wantLine); err != nil {
		t.Fatal(err)
	}
	sourcePod := launcherPod(t, vmi)
	port := fmt.Sprint(protocol.ServePort)
	boot, before := waitGuestAnswer(t, network, net.JoinHostPort(sourcePod.Status.PodIP, port), 30*time.Second)
	t.Logf("the guest answers on the source pod's address %s: boot %s counter %d", sourcePod.Status.PodIP, boot, before)

	evict(t, source, vmi)
	moved := waitVMI(t, ns, vmi.Name, grace*time.Second, "the VM on the other node",
		func(v *v1alpha1.VirtualMachineInstance) bool {
			return v.Status.NodeName != "" && v.Status.NodeName != source.Name() && v.Status.MigrationState != nil && v.Status.MigrationState.Completed
		})
	targetPod := launcherPodOn(t, moved, moved.Status.NodeName)
	if targetPod.Status.PodIP == sourcePod.Status.PodIP {
		t.Fatalf("the target pod has the source pod's address %s", targetPod.Status.PodIP)
	}
	bootAfter, after := waitGuestAnswer(t, network, net.JoinHostPort(targetPod.Status.PodIP, port), 30*time.Second)
	if bootAfter != boot || after < before {
		t.Errorf("after the migration the guest answers boot %s counter %d on %s; want boot %s (no reboot) and a counter of at least %d",
			bootAfter, after, targetPod.Status.PodIP, boot, before)
	}
}
