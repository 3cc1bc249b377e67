package check

import corev1 "k8s.io/api/core/v1"

// pointers lists nodes as the listers do.
func pointers(nodes []corev1.Node) []*corev1.Node {
	out := make([]*corev1.Node, len(nodes))
	for i := range nodes {
		out[i] = &nodes[i]
	}
	return out
}
