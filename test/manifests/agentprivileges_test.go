package manifests

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// agentPrivileges is everything the agent's DaemonSet gets beyond an ordinary pod, as
// privilegesOf lists it: what docs/security.md ("The agent") explains, line for line. The agent is
// node-root-equivalent already (root with the kubelet's pod directory read-write); this list is
// what keeps it from quietly becoming more.
var agentPrivileges = []string{
	"pod hostNetwork=true",
	"pod hostPID=false",
	"pod hostIPC=false",
	"pod shareProcessNamespace=false",
	"pod runAsUser=unset runAsGroup=unset runAsNonRoot=unset fsGroup=unset supplementalGroups=[107] sysctls=[] seccomp=unset",
	"pod serviceAccount=lifeboat-agent",
	"pod initContainers=[] containers=[agent]",
	"container agent privileged=false runAsUser=0 runAsGroup=unset runAsNonRoot=unset allowPrivilegeEscalation=false readOnlyRootFilesystem=true procMount=unset seccomp=RuntimeDefault",
	"container agent capabilities drop=[ALL] add=[NET_ADMIN SETGID SETUID SYS_ADMIN SYS_CHROOT]",
	"container agent hostPorts=[]",
	"container agent mount /dev/net/tun from tun read-write",
	"container agent mount /host/sys/fs/cgroup from cgroup read-only",
	"container agent mount /var/lib/kubelet/device-plugins from device-plugins read-write",
	"container agent mount /var/lib/kubelet/pods from kubelet-pods read-write",
	"container agent mount /var/lib/lifeboat/pki from pki read-write",
	"container agent mount /var/run/lifeboat from run read-write",
	"volume cgroup hostPath /sys/fs/cgroup type Directory",
	"volume device-plugins hostPath /var/lib/kubelet/device-plugins type Directory",
	"volume kubelet-pods hostPath /var/lib/kubelet/pods type Directory",
	"volume pki emptyDir",
	"volume run hostPath /var/run/lifeboat type DirectoryOrCreate",
	"volume tun hostPath /dev/net/tun type CharDevice",
}

// TestTheAgentsPrivilegesArePinned: the agent DaemonSet, as kustomize renders manifests/, has
// exactly the capabilities, host namespaces, host paths and security settings pinned above
// (issue 45, N5). Any change, a widening above all, fails here until the pin and
// docs/security.md say why.
func TestTheAgentsPrivilegesArePinned(t *testing.T) {
	objs, err := render(t.Context(), "")
	if err != nil {
		t.Fatalf("kubectl kustomize manifests/: %v", err)
	}
	var ds *appsv1.DaemonSet
	for _, o := range objs {
		if key(o) == "DaemonSet lifeboat-system/lifeboat-agent" {
			ds = &appsv1.DaemonSet{}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, ds); err != nil {
				t.Fatal(err)
			}
		}
	}
	if ds == nil {
		t.Fatal("manifests/ renders no DaemonSet lifeboat-system/lifeboat-agent")
	}
	if diff := cmp.Diff(agentPrivileges, privilegesOf(&ds.Spec.Template.Spec)); diff != "" {
		t.Errorf("the agent DaemonSet's privileges are not the pinned ones (-pinned +manifests/agent.yaml):\n%s\n"+
			"The agent runs as root on every KVM node next to tenants' VMs: a capability, host namespace or host path more is "+
			"a widening of what a compromised agent (or a bug in it) can do to the node. If the change is meant, update "+
			"agentPrivileges here and the agent's section of docs/security.md in the same commit, saying why.", diff)
	}
}

// privilegesOf lists what spec grants beyond an ordinary pod, one line each, mounts and volumes
// sorted.
func privilegesOf(spec *corev1.PodSpec) []string {
	opt := func(v any) string {
		switch p := v.(type) {
		case *int64:
			if p != nil {
				return fmt.Sprint(*p)
			}
		case *bool:
			if p != nil {
				return fmt.Sprint(*p)
			}
		case *corev1.ProcMountType:
			if p != nil {
				return string(*p)
			}
		case *corev1.SeccompProfile:
			if p != nil {
				return string(p.Type) + strings.TrimSuffix(" "+ptrString(p.LocalhostProfile), " ")
			}
		}
		return "unset"
	}
	flag := func(b *bool) bool { return b != nil && *b }
	psc := spec.SecurityContext
	if psc == nil {
		psc = &corev1.PodSecurityContext{}
	}
	var sysctls []string
	for _, s := range psc.Sysctls {
		sysctls = append(sysctls, s.Name+"="+s.Value)
	}
	names := func(cs []corev1.Container) []string {
		var n []string
		for _, c := range cs {
			n = append(n, c.Name)
		}
		return n
	}
	lines := []string{
		fmt.Sprintf("pod hostNetwork=%t", spec.HostNetwork),
		fmt.Sprintf("pod hostPID=%t", spec.HostPID),
		fmt.Sprintf("pod hostIPC=%t", spec.HostIPC),
		fmt.Sprintf("pod shareProcessNamespace=%t", flag(spec.ShareProcessNamespace)),
		fmt.Sprintf("pod runAsUser=%s runAsGroup=%s runAsNonRoot=%s fsGroup=%s supplementalGroups=%v sysctls=%v seccomp=%s",
			opt(psc.RunAsUser), opt(psc.RunAsGroup), opt(psc.RunAsNonRoot), opt(psc.FSGroup), psc.SupplementalGroups, sysctls, opt(psc.SeccompProfile)),
		"pod serviceAccount=" + spec.ServiceAccountName,
		fmt.Sprintf("pod initContainers=%v containers=%v", names(spec.InitContainers), names(spec.Containers)),
	}
	for _, c := range append(slices.Clone(spec.InitContainers), spec.Containers...) {
		sc := c.SecurityContext
		if sc == nil {
			sc = &corev1.SecurityContext{}
		}
		lines = append(lines, fmt.Sprintf("container %s privileged=%t runAsUser=%s runAsGroup=%s runAsNonRoot=%s allowPrivilegeEscalation=%s readOnlyRootFilesystem=%s procMount=%s seccomp=%s",
			c.Name, flag(sc.Privileged), opt(sc.RunAsUser), opt(sc.RunAsGroup), opt(sc.RunAsNonRoot), opt(sc.AllowPrivilegeEscalation), opt(sc.ReadOnlyRootFilesystem), opt(sc.ProcMount), opt(sc.SeccompProfile)))
		var add, drop []string
		if sc.Capabilities != nil {
			for _, a := range sc.Capabilities.Add {
				add = append(add, string(a))
			}
			for _, d := range sc.Capabilities.Drop {
				drop = append(drop, string(d))
			}
		}
		slices.Sort(add)
		slices.Sort(drop)
		lines = append(lines, fmt.Sprintf("container %s capabilities drop=%v add=%v", c.Name, drop, add))
		var hostPorts []string
		for _, p := range c.Ports {
			if p.HostPort != 0 {
				hostPorts = append(hostPorts, fmt.Sprintf("%d/%s", p.HostPort, p.Protocol))
			}
		}
		lines = append(lines, fmt.Sprintf("container %s hostPorts=%v", c.Name, hostPorts))
		var mounts []string
		for _, m := range c.VolumeMounts {
			mode := "read-write"
			if m.ReadOnly {
				mode = "read-only"
			}
			mounts = append(mounts, fmt.Sprintf("container %s mount %s from %s %s", c.Name, m.MountPath, m.Name, mode))
		}
		for _, d := range c.VolumeDevices {
			mounts = append(mounts, fmt.Sprintf("container %s device %s from %s", c.Name, d.DevicePath, d.Name))
		}
		slices.Sort(mounts)
		lines = append(lines, mounts...)
	}
	var volumes []string
	for _, v := range spec.Volumes {
		switch {
		case v.HostPath != nil:
			typ := "unset"
			if v.HostPath.Type != nil {
				typ = string(*v.HostPath.Type)
			}
			volumes = append(volumes, fmt.Sprintf("volume %s hostPath %s type %s", v.Name, v.HostPath.Path, typ))
		case v.EmptyDir != nil:
			volumes = append(volumes, fmt.Sprintf("volume %s emptyDir", v.Name))
		default:
			// Any other kind (a Secret, a projected token, a claim) is listed whole.
			src, _ := runtime.DefaultUnstructuredConverter.ToUnstructured(&v.VolumeSource)
			volumes = append(volumes, fmt.Sprintf("volume %s %v", v.Name, src))
		}
	}
	slices.Sort(volumes)
	return append(lines, volumes...)
}

func ptrString(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
