// Package stockcluster tests lifeboat on a cluster with upstream defaults, installed as the
// README's "Install on a cluster" says: kube-apiserver without a webhook AdmissionConfiguration
// (it presents no client certificate to webhooks) and without the EvictionRequest API,
// kube-controller-manager and kube-scheduler, and three real nodes (containerd, runc and the
// kubelet, test/realnode) with the kubelet's default eviction settings: two for VMs, and one that
// runs none, where lifeboat's controller and signer go (they keep off VM nodes); lifeboat's images pushed
// by the code of make push to a registry (in the test's process) that the nodes pull from, and
// manifests/ applied through an overlay that only points the images at it.
//
// What this machine forces, none of it lifeboat's configuration:
//   - the nodes run in the machine's network namespace, at 127.0.0.41 to 127.0.0.43, each
//     node's containerd and kubelet in a mount namespace of its own where the node's directories
//     are at /var/lib/kubelet and /var/run/lifeboat, and with a cgroup root of its own;
//   - there is no Service network, and a Service's endpoints may not be loopback addresses: the
//     install overlay adds one test-only kustomize component, no-service-network/, which points
//     lifeboat's pods at the API server's loopback address, puts the controller (one replica) on
//     the host network with its webhook called at https://127.0.0.1:8443 (--webhook-url, and the
//     same URL in the webhook configuration), puts the signer on the host network without its
//     metrics port, makes the agents listen on their node's address
//     (two agents share one network namespace here) and runs TCG guests;
//   - the kubelets keep the default hard memory.available threshold but no disk thresholds (the
//     machine's disk is fuller than their defaults allow), and listen on their node's address;
//     their authentication and authorization are the defaults (no anonymous caller, the API server
//     checks tokens and authorizes each request), so the agent's read of /configz is checked as
//     on a real cluster.
package stockcluster
