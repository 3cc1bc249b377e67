package vmi

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

// ReasonFailedMount: the kubelet cannot mount a volume of the VMI's launcher pod (a Secret or a
// claim that is missing or not yet bound), relayed from the pod to the VMI.
const ReasonFailedMount = "FailedMount"

// NewMountFailureInformers watches only the kubelet's FailedMount Events about pods, so that the
// cache holds few Events whatever the cluster's rate of others.
func NewMountFailureInformers(kube kubernetes.Interface) informers.SharedInformerFactory {
	return informers.NewSharedInformerFactoryWithOptions(kube, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.Set{"involvedObject.kind": "Pod", "reason": ReasonFailedMount}.String()
	}))
}

// RelayMountFailures copies the kubelet's FailedMount Events of a pending launcher pod to its
// VMI, from the events informer that NewMountFailureInformers makes. The controller never reads
// Secrets (least privilege), so it cannot tell a missing Secret itself; the kubelet can, and says
// so on the pod, where a user looking at the VMI would not look.
func (c *Controller) RelayMountFailures(events coreinformers.EventInformer) {
	c.synced = append(c.synced, events.Informer().HasSynced)
	_, _ = events.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: c.relayMountFailure,
		// The kubelet counts a repeated failure on the same Event.
		UpdateFunc: func(_, obj any) { c.relayMountFailure(obj) },
	})
}

func (c *Controller) relayMountFailure(obj any) {
	e, ok := obj.(*corev1.Event)
	if !ok || e.Reason != ReasonFailedMount || e.InvolvedObject.Kind != "Pod" {
		return
	}
	pod, err := c.pods.Pods(e.InvolvedObject.Namespace).Get(e.InvolvedObject.Name)
	// Only a pod still waiting for its volumes: the Events of an earlier pod of the same name,
	// or of one that has since started, say nothing about the VMI now.
	if err != nil || pod.UID != e.InvolvedObject.UID || pod.Status.Phase != corev1.PodPending {
		return
	}
	ref := v1alpha1.VMIController(pod)
	if ref == nil {
		return
	}
	vmi, err := c.vmis.VirtualMachineInstances(pod.Namespace).Get(ref.Name)
	if err != nil || vmi.UID != ref.UID {
		return
	}
	c.recorder.Eventf(vmi, corev1.EventTypeWarning, ReasonFailedMount, "launcher pod %s: %s", pod.Name, e.Message)
	c.log.Info("launcher pod cannot mount a volume", "vmi", vmi.Namespace+"/"+vmi.Name, "pod", pod.Name, "message", e.Message)
}
