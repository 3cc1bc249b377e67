// Package v1alpha1 holds the lifeboat.dev/v1alpha1 API: virtual machine instances,
// their migrations and the cluster-wide lifeboat configuration.
//
// +k8s:deepcopy-gen=package
// +groupName=lifeboat.dev
// +groupGoName=Lifeboat
package v1alpha1
