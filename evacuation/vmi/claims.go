package vmi

import (
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

// Reasons a VMI's claims keep it from having a pod (Warning Events on the VMI).
const (
	// ReasonClaimNotFound: a persistentVolumeClaim volume names a claim the namespace lacks.
	ReasonClaimNotFound = "ClaimNotFound"
)

// ClaimError is a claim that keeps the VMI from having a pod until it changes.
type ClaimError struct{ Reason, Message string }

func (e *ClaimError) Error() string { return e.Message }

// ClaimStatuses are the VolumeStatus of the VMI's persistentVolumeClaim volumes, from their
// claims as get finds them (by name, in the VMI's namespace). A claim that does not exist is a
// *ClaimError. A claim not bound yet is fine: the scheduler binds it
// with the pod (WaitForFirstConsumer), and its requested access modes are what it will have.
func ClaimStatuses(vmi *v1alpha1.VirtualMachineInstance, get func(name string) (*corev1.PersistentVolumeClaim, error)) ([]v1alpha1.VolumeStatus, error) {
	var out []v1alpha1.VolumeStatus
	for _, v := range vmi.Spec.Volumes {
		if v.PersistentVolumeClaim == nil {
			continue
		}
		name := v.PersistentVolumeClaim.ClaimName
		claim, err := get(name)
		if apierrors.IsNotFound(err) {
			return nil, &ClaimError{ReasonClaimNotFound, fmt.Sprintf("volume %q: persistentVolumeClaim %q does not exist in namespace %s", v.Name, name, vmi.Namespace)}
		}
		if err != nil {
			return nil, err
		}
		modes := claim.Status.AccessModes
		if len(modes) == 0 {
			modes = claim.Spec.AccessModes
		}
		out = append(out, v1alpha1.VolumeStatus{Name: v.Name, PersistentVolumeClaimInfo: &v1alpha1.PersistentVolumeClaimInfo{
			ClaimName: name, AccessModes: slices.Clone(modes), VolumeMode: claim.Spec.VolumeMode, Capacity: claim.Status.Capacity.DeepCopy(),
		}})
	}
	return out, nil
}
