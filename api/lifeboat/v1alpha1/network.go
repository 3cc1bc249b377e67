package v1alpha1

import (
	"crypto/sha256"
	"fmt"
	"net"
)

// PodInterface is the spec's interface on the pod network; ok is false when it has none. An
// interface naming a network the spec does not have, or two on the pod network, is an error
// (the API refuses both; this holds for VMIs stored before it did).
func PodInterface(spec *VirtualMachineInstanceSpec) (iface Interface, ok bool, err error) {
	pod := map[string]bool{}
	for _, n := range spec.Networks {
		pod[n.Name] = n.Pod != nil
	}
	for _, i := range spec.Interfaces {
		onPod, known := pod[i.Name]
		switch {
		case !known:
			return Interface{}, true, fmt.Errorf("interface %q names no network of spec.networks", i.Name)
		case !onPod:
			continue
		case ok:
			return Interface{}, true, fmt.Errorf("interfaces %q and %q are both on the pod network; a VM has at most one", iface.Name, i.Name)
		}
		iface, ok = i, true
	}
	return iface, ok, nil
}

// MAC is the card's MAC address: the one the spec gives, or one derived from the VMI's UID
// (locally administered, unicast, as KubeVirt's generated ones), so that every pod the VMI runs
// in gives the guest the same card.
func (i Interface) MAC(vmiUID string) (net.HardwareAddr, error) {
	if i.MACAddress != "" {
		return net.ParseMAC(i.MACAddress)
	}
	sum := sha256.Sum256([]byte(vmiUID + "/" + i.Name))
	return net.HardwareAddr{0x02, sum[0], sum[1], sum[2], sum[3], sum[4]}, nil
}
