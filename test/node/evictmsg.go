package node

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// The kubelet's eviction message fragments and event annotation keys
// (pkg/kubelet/eviction/helpers.go), verbatim: each fragment ends with a space.
const (
	nodeLowMessageFmt      = "The node was low on resource: %v. "
	thresholdMetMessageFmt = "Threshold quantity: %v, available: %v. "
	containerMessageFmt    = "Container %s was using %s, request is %s, has larger consumption of %v. "

	offendingContainersKey      = "offending_containers"
	offendingContainersUsageKey = "offending_containers_usage"
	starvedResourceKey          = "starved_resource"
)

// evictionMessage is the kubelet's message and event annotations for evicting pod to reclaim
// memory after the memory.available threshold was crossed: the threshold and what was
// available, then every container whose working set (usage) exceeds its memory request.
// Containers without a usage figure are left out, as the kubelet leaves out containers it has
// no statistics for.
func evictionMessage(pod *corev1.Pod, threshold, available resource.Quantity, usage map[string]resource.Quantity) (string, map[string]string) {
	message := fmt.Sprintf(nodeLowMessageFmt, corev1.ResourceMemory) +
		fmt.Sprintf(thresholdMetMessageFmt, &threshold, &available)
	var containers, usages []string
	for _, c := range pod.Spec.Containers {
		used, ok := usage[c.Name]
		if !ok {
			continue
		}
		request := c.Resources.Requests[corev1.ResourceMemory]
		if used.Cmp(request) > 0 {
			message += fmt.Sprintf(containerMessageFmt, c.Name, used.String(), request.String(), corev1.ResourceMemory)
			containers = append(containers, c.Name)
			usages = append(usages, used.String())
		}
	}
	return message, map[string]string{
		offendingContainersKey:      strings.Join(containers, ","),
		offendingContainersUsageKey: strings.Join(usages, ","),
		starvedResourceKey:          string(corev1.ResourceMemory),
	}
}
