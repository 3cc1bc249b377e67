package agent

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifeboat-vm/lifeboat/agent/podnetwork"
	contract "github.com/lifeboat-vm/lifeboat/api/launcher"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/api/notify"
)

// SetupNetwork builds, in the network namespace netns that ref's launcher sent, the guest's
// side of the pod network as the VMI's spec says. The spec comes from the API server, not from
// the launcher: a migration target's VMI is not among this node's yet, and a launcher is not
// trusted to say what its VM may have.
func (a *Agent) SetupNetwork(ctx context.Context, ref notify.VMIRef, netns *os.File) (*notify.Lease, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	vmi, err := a.lifeboat.LifeboatV1alpha1().VirtualMachineInstances(ref.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
	if err == nil && string(vmi.UID) != ref.UID {
		err = fmt.Errorf("VMI %s/%s is another VMI now (uid %s)", ref.Namespace, ref.Name, vmi.UID)
	}
	if err != nil {
		a.cfg.Metrics.PodNetworks.WithLabelValues("unknown", "failed").Inc()
		return nil, fmt.Errorf("reading VMI %s: %w", ref, err)
	}
	plan, ok, err := podnetwork.PlanFor(vmi, contract.UID)
	if err == nil && !ok {
		err = fmt.Errorf("VMI %s has no interface on the pod network", ref)
	}
	var lease *notify.Lease
	if err == nil {
		lease, err = podnetwork.Setup(netns, plan)
	}
	binding := string(plan.Binding)
	if binding == "" {
		binding = "unknown"
	}
	if err != nil {
		a.cfg.Metrics.PodNetworks.WithLabelValues(binding, "failed").Inc()
		a.cfg.Recorder.Eventf(vmi, corev1.EventTypeWarning, ReasonPodNetworkFailed, "Building the pod network on node %s: %v", a.cfg.NodeName, err)
		return nil, err
	}
	if err := a.keepNetns(ref.UID, netns); err != nil {
		a.cfg.Log.Warn("keeping the pod's network namespace: its pod will not forward to a migration's target", "vmi", ref.String(), "err", err)
	}
	a.watchGuestFilter(vmi, netns)
	a.cfg.Metrics.PodNetworks.WithLabelValues(binding, "built").Inc()
	a.cfg.Log.Info("built the pod network", "vmi", ref.String(), "binding", plan.Binding, "guestAddress", lease.Address, "mtu", lease.MTU)
	return lease, nil
}

// ReasonPodNetworkFailed is the Warning Event on a VMI whose launcher pod's network the agent could not build.
const ReasonPodNetworkFailed = "PodNetworkFailed"

// watchGuestFilter keeps netns to serve its guest filter's counters until the launcher's
// directory goes; if it went already, keeping it would hold a deleted pod's namespace.
func (a *Agent) watchGuestFilter(vmi *v1alpha1.VirtualMachineInstance, netns *os.File) {
	uid := string(vmi.UID)
	if err := a.cfg.Metrics.guestDrops.watch(uid, vmi.Namespace, vmi.Name, netns); err != nil {
		a.cfg.Log.Warn("keeping the pod's network namespace to read its filter's counters", "vmi", vmi.Namespace+"/"+vmi.Name, "err", err)
		return
	}
	if _, err := os.Stat(filepath.Join(a.cfg.DomainsDir, uid)); a.cfg.DomainsDir != "" && errors.Is(err, fs.ErrNotExist) {
		a.cfg.Metrics.guestDrops.forget(uid)
	}
}
