// Package realnode runs a real Kubernetes node for lifeboat's tests: containerd 2.x built from
// the pinned Go modules (it mounts image volumes, which Debian 12's 1.6 cannot), Debian's runc,
// the emulated nodes' pod network through CNI (or none), a pause image built here and
// imported (there is no registry), and kubelet v1.37.1 built from the pinned Go modules like
// the control plane (test/controlplane). Everything lives in the node's own directory and is
// torn down by Stop.
//
// Choices forced by this machine, each checked here:
//   - the cgroupfs driver, on cgroup v1 (this machine; failCgroupV1 is false) or v2 alike: Start
//     prints which hierarchy it found, and the clean-up finds the pod cgroups in either layout;
//   - the kubelet refuses a loopback --node-ip, so it runs with an external cloud provider and
//     Start plays that provider: it sets the node's InternalIP (in 127.0.0.0/8) and removes the
//     uninitialized taint;
//   - nothing may be added to the machine's own network: with Config.Network the node's pods
//     join the pod network of test/node, whose bridges live in a network namespace the harness
//     makes (the bridge plugin runs there); without one the CNI configuration is loopback-only,
//     only satisfies the runtime's readiness check, and pods must use the host's network;
//   - the kubelet owns the kubepods cgroups of the machine, so one real node runs at a time.
package realnode
