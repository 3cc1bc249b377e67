// Package node emulates Kubernetes nodes for lifeboat's tests and demo: a kubelet stand-in that
// registers a Node, keeps its Lease and Ready condition fresh, and runs the pods the real
// kube-scheduler binds to it as host processes, writing pod status the way kubelet v1.37.1 does.
//
// Each container runs in its own PID and mount namespaces under a small init (the shim, a
// re-execution of the current binary; see MaybeRunShim), so that killing a pod kills every
// process the container started, daemons included, and hostPath volumes are bind-mounted at
// their mountPath without touching the machine's mounts. Host paths under the node's private
// prefixes live under the node's root directory, so several nodes on one machine do not share
// them. Without Config.Network, pods share the machine's network and report the node's loopback
// address as their IP. With it, a pod not on the host's network gets its own network namespace,
// wired by the CNI bridge plugin with host-local IPAM as a runtime wires a sandbox (Network:
// every node's bridge in one namespace the harness makes, the fabric, where kube-proxy can route
// Services); the pod reports that address. Devices of extended resources a container asks for
// (Config.Devices) are made in its /dev for its user, as a device plugin's are.
//
// What the kubelet does that this package reproduces, from kubelet v1.37.1:
//   - pod phase and conditions (getPhase, status.Generate*Condition), container states and
//     reasons (Completed, Error, StartError, ContainerStatusUnknown, CrashLoopBackOff), the
//     observedGeneration fields, and container statuses sorted by name;
//   - restart policies Always and OnFailure with the kubelet's back-off (immediate first
//     restart, then 10s doubling up to 5 minutes);
//   - graceful termination: SIGTERM, SIGKILL when the grace period ends, a grace period that
//     only ever shortens and is never below one second (pod_workers.go
//     calculateEffectiveGracePeriod); a deleted pod gets a terminal status and is then deleted
//     with grace period 0; while a pod is being stopped, its Ready condition keeps what its
//     readiness gates said when the stop began (SyncTerminatingPod writes the status once, then
//     waits in killPod), so a gate that changes meanwhile counts only once the containers end;
//   - node-pressure eviction (EvictPod): the Evicted event with its annotations, the kubelet's
//     message, grace min(evictionMaxPodGracePeriod, terminationGracePeriodSeconds), and a
//     final status with phase Failed, reason Evicted and the DisruptionTarget condition (but
//     Succeeded, with the condition, when every container exited 0, as a real v1.37.1 node
//     shows: the kubelet takes the phase from the containers). As in
//     v1.37.1 (status_manager.go mergePodStatus), the condition reaches the API together with
//     the terminal phase, once the containers have stopped, not before the SIGTERM.
//
// A container runs as its securityContext says (runAsUser, runAsGroup, fsGroup and
// supplementalGroups; runAsNonRoot refused for root; allowPrivilegeEscalation false as
// no_new_privs): the shim makes the mounts as root, then starts the command as that user, which
// leaves it no capability. The machine's /etc/passwd and /etc/group are the container's, with a
// record added for a user they lack, as the container's image would have. The binary is opened
// as root and executed through its descriptor, so the user need not reach the node's paths.
// Seccomp profiles and capabilities added to root are not applied.
//
// The node serves the kubelet API's /containerLogs and /exec on its address, at the port its
// Node publishes (Config.KubeletPort), so that kubectl logs and kubectl exec work through the API
// server. It authenticates and authorizes callers as a kubelet with anonymous access off and
// webhook authorization does: a client certificate of the API server's client CA, and a
// SubjectAccessReview for nodes/proxy. Logs are the containers' raw output (follow, tailLines,
// limitBytes and previous; no timestamps). Exec streams through the kubelet's streaming server
// code (k8s.io/cri-streaming); the command, on pipes or a terminal of its own, is started by an
// exec shim (another re-execution of the current binary) in the container's mount, PID and
// network namespaces, as the container's user with its environment. There is no attach,
// port-forward or /configz.
//
// Image volumes are pulled from the node's image store (Config.Images, an OCI image layout),
// unpacked once and bind-mounted read-only. A persistentVolumeClaim volume is its bound
// PersistentVolume's directory (hostPath or local volumes only); a secret volume, the Secret's
// keys as files.
//
// What it does not do: container images (a container's command[0] names a binary in
// Config.Binaries), init containers (such pods are rejected), probes, resource limits, volume
// types other than hostPath, emptyDir, image, persistentVolumeClaim and secret (others, the service-account token volume among
// them, are not mounted), envFrom and env values from ConfigMaps or Secrets, and node pressure conditions.
package node
