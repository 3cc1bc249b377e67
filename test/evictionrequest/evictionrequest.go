// Package evictionrequest plays, for tests, the part of Kubernetes' evictionrequest controller,
// which kube-controller-manager 1.37 does not have: it turns EvictionRequests for a pod into the
// pod's Eviction and moves the Eviction's status (requesters, targetResponders, the active
// responder's startTime, conditions) as that controller's documented part says, through the real
// API server, whose validation checks every step.
package evictionrequest

import (
	"context"
	"crypto/sha256"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	lifecyclev1alpha1 "k8s.io/api/lifecycle/v1alpha1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
)

// imperativePriority is the API's fixed priority of the default imperative-eviction responder.
const imperativePriority = 100

// Controller drives the Eviction of one pod.
type Controller struct {
	kube kubernetes.Interface
	pod  *corev1.Pod
	// Name is the Eviction's name.
	Name string
}

// Request has requester ask for the pod's eviction: an EvictionRequest, and (for the first one)
// the pod's Eviction with its responders from pod.spec.evictionResponders plus the imperative
// evictor, the highest-priority one Active with its startTime, as the controller sets them.
func Request(ctx context.Context, kube kubernetes.Interface, pod *corev1.Pod, requester string) (*Controller, error) {
	c := &Controller{kube: kube, pod: pod, Name: "eviction-" + string(pod.UID)}
	if err := c.createRequest(ctx, requester); err != nil {
		return nil, err
	}
	responders := append([]corev1.EvictionResponder{}, pod.Spec.EvictionResponders...)
	responders = append(responders, corev1.EvictionResponder{Name: lifecyclev1alpha1.EvictionResponderImperativeEviction, Priority: ptr.To[int32](imperativePriority)})
	slices.SortStableFunc(responders, func(a, b corev1.EvictionResponder) int { return int(*b.Priority - *a.Priority) })
	labels := map[string]string{requester: string(lifecyclev1alpha1.EvictionParticipantRoleRequester)}
	for _, r := range responders {
		labels[r.Name] = string(lifecyclev1alpha1.EvictionParticipantRoleResponder)
	}
	ev, err := kube.LifecycleV1alpha1().Evictions(pod.Namespace).Create(ctx, &lifecyclev1alpha1.Eviction{
		ObjectMeta: metav1.ObjectMeta{Name: c.Name, Labels: labels},
		Spec:       lifecyclev1alpha1.EvictionSpec{Target: lifecyclev1alpha1.EvictionTarget{Pod: &lifecyclev1alpha1.EvictionPodReference{Name: pod.Name, UID: pod.UID}}},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("creating the Eviction of pod %s: %w", pod.Name, err)
	}
	now := metav1.Now()
	ev.Status.ObservedGeneration = ptr.To(ev.Generation)
	ev.Status.Requesters = []lifecyclev1alpha1.Requester{{Name: requester, Intent: lifecyclev1alpha1.RequesterIntentEviction}}
	for i, r := range responders {
		state, status := lifecyclev1alpha1.ResponderStateInactive, lifecyclev1alpha1.ResponderStatus{Name: r.Name}
		if i == 0 {
			state, status.StartTime = lifecyclev1alpha1.ResponderStateActive, &now
		}
		ev.Status.TargetResponders = append(ev.Status.TargetResponders, lifecyclev1alpha1.TargetResponder{Name: r.Name, Priority: r.Priority, State: state})
		ev.Status.Responders = append(ev.Status.Responders, status)
	}
	if _, err := kube.LifecycleV1alpha1().Evictions(pod.Namespace).UpdateStatus(ctx, ev, metav1.UpdateOptions{}); err != nil {
		return nil, fmt.Errorf("initialising the Eviction's status: %w", err)
	}
	return c, nil
}

func (c *Controller) requestName(requester string) string {
	sum := sha256.Sum256([]byte(requester))
	return fmt.Sprintf("%s-%x", c.pod.UID, sum[:4])
}

func (c *Controller) createRequest(ctx context.Context, requester string) error {
	_, err := c.kube.LifecycleV1alpha1().EvictionRequests(c.pod.Namespace).Create(ctx, &lifecyclev1alpha1.EvictionRequest{
		ObjectMeta: metav1.ObjectMeta{Name: c.requestName(requester)},
		Spec: lifecyclev1alpha1.EvictionRequestSpec{
			Target:    lifecyclev1alpha1.EvictionRequestTarget{Pod: &lifecyclev1alpha1.EvictionRequestPodReference{Name: c.pod.Name, UID: c.pod.UID}},
			Requester: requester,
			Intent:    lifecyclev1alpha1.EvictionRequestIntentEviction,
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("creating the EvictionRequest of %s: %w", requester, err)
	}
	return nil
}

// Join adds a second requester for the same pod: its EvictionRequest and its entry in the Eviction.
func (c *Controller) Join(ctx context.Context, requester string) error {
	if err := c.createRequest(ctx, requester); err != nil {
		return err
	}
	return c.updateStatus(ctx, func(ev *lifecyclev1alpha1.Eviction) {
		ev.Status.Requesters = append(ev.Status.Requesters, lifecyclev1alpha1.Requester{Name: requester, Intent: lifecyclev1alpha1.RequesterIntentEviction})
	})
}

// Withdraw withdraws requester's intent. When no requester is left, the Eviction is canceled:
// the active responder becomes Canceled and the Failed condition says why.
func (c *Controller) Withdraw(ctx context.Context, requester string) error {
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		requests := c.kube.LifecycleV1alpha1().EvictionRequests(c.pod.Namespace)
		er, err := requests.Get(ctx, c.requestName(requester), metav1.GetOptions{})
		if err != nil {
			return err
		}
		er.Spec.Intent = lifecyclev1alpha1.EvictionRequestIntentWithdrawn
		_, err = requests.Update(ctx, er, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("withdrawing the EvictionRequest of %s: %w", requester, err)
	}
	return c.updateStatus(ctx, func(ev *lifecyclev1alpha1.Eviction) {
		remaining := 0
		for i := range ev.Status.Requesters {
			if ev.Status.Requesters[i].Name == requester {
				ev.Status.Requesters[i].Intent = lifecyclev1alpha1.RequesterIntentWithdrawn
			}
			if ev.Status.Requesters[i].Intent == lifecyclev1alpha1.RequesterIntentEviction {
				remaining++
			}
		}
		if remaining > 0 {
			return
		}
		for i := range ev.Status.TargetResponders {
			if ev.Status.TargetResponders[i].State == lifecyclev1alpha1.ResponderStateActive {
				ev.Status.TargetResponders[i].State = lifecyclev1alpha1.ResponderStateCanceled
			}
		}
		meta.SetStatusCondition(&ev.Status.Conditions, metav1.Condition{Type: string(lifecyclev1alpha1.EvictionConditionFailed), Status: metav1.ConditionTrue,
			Reason: string(lifecyclev1alpha1.EvictionConditionReasonCanceledDueToNoRequesters), Message: "every requester withdrew", ObservedGeneration: ev.Generation})
	})
}

// TargetDeleted is what the evictionrequest controller does when the target pod is deleted while
// a responder is active: the Eviction gets condition TargetEvicted (reason PodDeleted) and the
// active responder becomes Interrupted. The API server allows that before the responder's
// heartbeat deadline only because the Eviction is then final.
func (c *Controller) TargetDeleted(ctx context.Context) error {
	return c.updateStatus(ctx, func(ev *lifecyclev1alpha1.Eviction) {
		for i := range ev.Status.TargetResponders {
			if ev.Status.TargetResponders[i].State == lifecyclev1alpha1.ResponderStateActive {
				ev.Status.TargetResponders[i].State = lifecyclev1alpha1.ResponderStateInterrupted
			}
		}
		meta.SetStatusCondition(&ev.Status.Conditions, metav1.Condition{Type: string(lifecyclev1alpha1.EvictionConditionTargetEvicted), Status: metav1.ConditionTrue,
			Reason: string(lifecyclev1alpha1.EvictionConditionReasonPodDeleted), Message: "the pod was deleted", ObservedGeneration: ev.Generation})
	})
}

// Advance moves on from a responder that reported completionTime: it becomes Completed and the
// next one Active with its startTime. It returns the newly active responder's name.
func (c *Controller) Advance(ctx context.Context) (string, error) {
	var next string
	err := c.updateStatus(ctx, func(ev *lifecyclev1alpha1.Eviction) {
		next = ""
		now := metav1.Now()
		tr := ev.Status.TargetResponders
		for i := range tr {
			if tr[i].State != lifecyclev1alpha1.ResponderStateActive || i+1 == len(tr) {
				continue
			}
			tr[i].State = lifecyclev1alpha1.ResponderStateCompleted
			tr[i+1].State = lifecyclev1alpha1.ResponderStateActive
			next = tr[i+1].Name
			for j := range ev.Status.Responders {
				if ev.Status.Responders[j].Name == next {
					ev.Status.Responders[j].StartTime = &now
				}
			}
			return
		}
	})
	return next, err
}

// Get reads the Eviction.
func (c *Controller) Get(ctx context.Context) (*lifecyclev1alpha1.Eviction, error) {
	return c.kube.LifecycleV1alpha1().Evictions(c.pod.Namespace).Get(ctx, c.Name, metav1.GetOptions{})
}

// Wait polls the Eviction until cond holds, and says what was expected and seen if it does not.
func (c *Controller) Wait(ctx context.Context, timeout time.Duration, what string, cond func(*lifecyclev1alpha1.Eviction) bool) (*lifecyclev1alpha1.Eviction, error) {
	var last *lifecyclev1alpha1.Eviction
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		ev, err := c.Get(ctx)
		if err != nil {
			return false, nil
		}
		last = ev
		return cond(ev), nil
	})
	if err != nil {
		return last, fmt.Errorf("eviction %s: want %s within %s; last status %+v", c.Name, what, timeout, statusOf(last))
	}
	return last, nil
}

func statusOf(ev *lifecyclev1alpha1.Eviction) any {
	if ev == nil {
		return "none"
	}
	return ev.Status
}

func (c *Controller) updateStatus(ctx context.Context, change func(*lifecyclev1alpha1.Eviction)) error {
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		ev, err := c.Get(ctx)
		if err != nil {
			return err
		}
		change(ev)
		_, err = c.kube.LifecycleV1alpha1().Evictions(c.pod.Namespace).UpdateStatus(ctx, ev, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("updating the status of eviction %s: %w", c.Name, err)
	}
	return nil
}
