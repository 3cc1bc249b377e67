package manifests

import (
	"context"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	kubeletconfig "k8s.io/kubelet/config/v1beta1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/lifeboat-vm/lifeboat/agent/pressure"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	vmipods "github.com/lifeboat-vm/lifeboat/evacuation/vmi"
	"github.com/lifeboat-vm/lifeboat/test/controlplane"
)

// The objects issue 8 lists, by kind and namespace/name.
var wantObjects = []string{
	"Namespace lifeboat-system",
	"CustomResourceDefinition virtualmachineinstances.lifeboat.dev",
	"CustomResourceDefinition virtualmachineinstancemigrations.lifeboat.dev",
	"CustomResourceDefinition lifeboatconfigs.lifeboat.dev",
	"CustomResourceDefinition virtualmachines.lifeboat.dev",
	"LifeboatConfig cluster",
	"ServiceAccount lifeboat-system/lifeboat-agent",
	"ClusterRole lifeboat-agent",
	"ClusterRoleBinding lifeboat-agent",
	"DaemonSet lifeboat-system/lifeboat-agent",
	"DaemonSet lifeboat-system/lifeboat-qemu-probe",
	"PriorityClass lifeboat-qemu-probe",
	"Role lifeboat-system/lifeboat-agent",
	"RoleBinding lifeboat-system/lifeboat-agent",
	"ServiceAccount lifeboat-system/lifeboat-controller",
	"ClusterRole lifeboat-controller",
	"ClusterRoleBinding lifeboat-controller",
	"Role lifeboat-system/lifeboat-controller",
	"RoleBinding lifeboat-system/lifeboat-controller",
	"Deployment lifeboat-system/lifeboat-controller",
	"Service lifeboat-system/lifeboat-webhook",
	"NetworkPolicy lifeboat-system/lifeboat-controller",
	"ServiceAccount lifeboat-system/lifeboat-signer",
	"ClusterRole lifeboat-signer",
	"ClusterRoleBinding lifeboat-signer",
	"Role lifeboat-system/lifeboat-signer",
	"RoleBinding lifeboat-system/lifeboat-signer",
	"Deployment lifeboat-system/lifeboat-signer",
	"NetworkPolicy lifeboat-system/lifeboat-signer",
	"ValidatingAdmissionPolicy lifeboat-kvm-node-label",
	"ValidatingAdmissionPolicyBinding lifeboat-kvm-node-label",
	"ValidatingWebhookConfiguration lifeboat-eviction",
	"ValidatingAdmissionPolicy lifeboat-vmi-node-paths",
	"ValidatingAdmissionPolicyBinding lifeboat-vmi-node-paths",
	"ValidatingAdmissionPolicy lifeboat-migration-cause",
	"ValidatingAdmissionPolicyBinding lifeboat-migration-cause",
	"ValidatingAdmissionPolicy lifeboat-cancel-evacuation",
	"ValidatingAdmissionPolicyBinding lifeboat-cancel-evacuation",
	"ClusterRole lifeboat-evacuation-canceller",
	"ClusterRole lifeboat-metrics-reader",
	"ClusterRole lifeboat-vm-edit",
	"ClusterRole lifeboat-vm-view",
	"ValidatingAdmissionPolicy lifeboat-evacuation-record",
	"ValidatingAdmissionPolicyBinding lifeboat-evacuation-record",
	"ValidatingAdmissionPolicy lifeboat-launcher-pod-record",
	"ValidatingAdmissionPolicyBinding lifeboat-launcher-pod-record",
	"ValidatingAdmissionPolicy lifeboat-agent-vmis",
	"ValidatingAdmissionPolicyBinding lifeboat-agent-vmis",
	"ValidatingAdmissionPolicy lifeboat-agent-migrations",
	"ValidatingAdmissionPolicyBinding lifeboat-agent-migrations",
	"ValidatingAdmissionPolicy lifeboat-controller-pods",
	"ValidatingAdmissionPolicyBinding lifeboat-controller-pods",
	"ValidatingAdmissionPolicy lifeboat-controller-pod-node-paths",
	"ValidatingAdmissionPolicyBinding lifeboat-controller-pod-node-paths",
	"ValidatingAdmissionPolicy lifeboat-controller-pod-secrets",
	"ValidatingAdmissionPolicyBinding lifeboat-controller-pod-secrets",
	"ValidatingAdmissionPolicy lifeboat-controller-pod-changes",
	"ValidatingAdmissionPolicyBinding lifeboat-controller-pod-changes",
	"ValidatingAdmissionPolicy lifeboat-reserved-metadata",
	"ValidatingAdmissionPolicyBinding lifeboat-reserved-metadata",
	"ValidatingAdmissionPolicy lifeboat-launcher-devices",
	"ValidatingAdmissionPolicyBinding lifeboat-launcher-devices",
	"ValidatingAdmissionPolicy lifeboat-post-copy-device",
	"ValidatingAdmissionPolicyBinding lifeboat-post-copy-device",
}

func key(o *unstructured.Unstructured) string {
	if o.GetNamespace() == "" {
		return o.GetKind() + " " + o.GetName()
	}
	return o.GetKind() + " " + o.GetNamespace() + "/" + o.GetName()
}

func TestEveryObjectIsAcceptedAndReapplyingChangesNothing(t *testing.T) {
	ctx := context.Background()
	objs := install(t)
	rendered := map[string]bool{}
	for _, o := range objs {
		rendered[key(o)] = true
	}
	for _, want := range wantObjects {
		if !rendered[want] {
			t.Errorf("manifests/ has no %s", want)
		}
	}
	a, err := newApplier()
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		stored, err := a.get(ctx, o)
		if err != nil {
			t.Errorf("applied, but not stored: %v", err)
			continue
		}
		if got := stored.GetLabels()["app.kubernetes.io/part-of"]; got != "lifeboat" {
			t.Errorf("%s: label app.kubernetes.io/part-of = %q, want lifeboat", key(o), got)
		}
		// The manifests say exactly what the server keeps: applying them again writes nothing.
		again, err := a.apply(ctx, o)
		if err != nil {
			t.Errorf("applying again: %v", err)
			continue
		}
		if o.GetKind() == "ValidatingAdmissionPolicy" {
			// The policy's status writer (an apply of its own) can make the server rewrite the
			// managed fields' timestamps; the spec is what must not change.
			if again.GetGeneration() != stored.GetGeneration() {
				t.Errorf("%s: applying the same manifest again changed its spec (generation %d → %d)", key(o), stored.GetGeneration(), again.GetGeneration())
			}
			continue
		}
		if again.GetResourceVersion() != stored.GetResourceVersion() {
			t.Errorf("%s: applying the same manifest again changed it (resourceVersion %s → %s)", key(o), stored.GetResourceVersion(), again.GetResourceVersion())
		}
	}
}

// The pods the workloads make pass admission in lifeboat-system: the service accounts exist,
// the critical priority classes are allowed there, Pod Security admits the agent's host access.
func TestWorkloadPodsAreAdmitted(t *testing.T) {
	ctx := context.Background()
	install(t)
	const ns = "lifeboat-system"

	// The Deployment's pods are really made, by kube-controller-manager.
	var pods []corev1.Pod
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := cluster.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=lifeboat-controller"})
		if err != nil {
			return false, err
		}
		pods = list.Items
		return len(pods) == 2, nil
	})
	if err != nil {
		t.Fatalf("want the Deployment's 2 controller pods, have %d: %v", len(pods), err)
	}
	for _, p := range pods {
		if p.Spec.ServiceAccountName != "lifeboat-controller" || p.Spec.Priority == nil || *p.Spec.Priority != 2000000000 {
			t.Errorf("controller pod %s: service account %q, priority %v; want lifeboat-controller, 2000000000 (system-cluster-critical)",
				p.Name, p.Spec.ServiceAccountName, p.Spec.Priority)
		}
	}

	var signers []corev1.Pod
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := cluster.Kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=lifeboat-signer"})
		if err != nil {
			return false, err
		}
		signers = list.Items
		return len(signers) == 1, nil
	})
	if err != nil {
		t.Fatalf("want the signer Deployment's pod, have %d: %v", len(signers), err)
	}
	if p := signers[0]; p.Spec.ServiceAccountName != "lifeboat-signer" {
		t.Errorf("signer pod %s: service account %q, want lifeboat-signer", p.Name, p.Spec.ServiceAccountName)
	}

	// The DaemonSet's pod, as it would be made for a KVM node, through admission without being stored.
	ds, err := cluster.Kube.AppsV1().DaemonSets(ns).Get(ctx, "lifeboat-agent", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{ObjectMeta: ds.Spec.Template.ObjectMeta, Spec: ds.Spec.Template.Spec}
	pod.GenerateName, pod.Namespace = "lifeboat-agent-", ns
	created, err := cluster.Kube.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	if err != nil {
		t.Fatalf("the agent's pod is not admitted: %v", err)
	}
	if created.Spec.Priority == nil || *created.Spec.Priority != 2000001000 {
		t.Errorf("agent pod priority %v, want 2000001000 (system-node-critical: the kubelet never evicts it for node pressure)", created.Spec.Priority)
	}
}

// The controller applies the webhook configuration with its CA bundle itself, with the
// controller's own service account; applying the manifests again must neither conflict with
// what it wrote nor drop the bundle.
func TestReapplyingKeepsTheControllersWebhookCABundle(t *testing.T) {
	ctx := context.Background()
	objs := install(t)
	var webhook *unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == "ValidatingWebhookConfiguration" {
			webhook = o
		}
	}
	if webhook == nil {
		t.Fatal("manifests/ has no ValidatingWebhookConfiguration")
	}
	client := cluster.Kube.AdmissionregistrationV1().ValidatingWebhookConfigurations()
	startReplica(t, serviceAccountKubeconfig(t, controllerSA), "webhook", "--webhook-listen", "127.0.0.1:0", "--webhook-client-ca", cluster.CAFile())
	var ca []byte
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		got, err := client.Get(ctx, webhook.GetName(), metav1.GetOptions{})
		if err != nil || len(got.Webhooks) != 1 {
			return false, err
		}
		ca = got.Webhooks[0].ClientConfig.CABundle
		return len(ca) > 0, nil
	})
	if err != nil {
		t.Fatalf("the controller wrote no CA bundle into %s: %v", webhook.GetName(), err)
	}
	a, err := newApplier()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.apply(ctx, webhook); err != nil {
		t.Fatalf("applying the manifest again after the controller: %v", err)
	}
	got, err := client.Get(ctx, webhook.GetName(), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Webhooks) != 1 || !equality.Semantic.DeepEqual(got.Webhooks[0].ClientConfig.CABundle, ca) {
		t.Errorf("after applying the manifests again the webhook's caBundle is %q, want the controller's %q", got.Webhooks[0].ClientConfig.CABundle, ca)
	}
}

func TestExamples(t *testing.T) {
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	examples := filepath.Join(root, "manifests", "examples")

	t.Run("kubelet configuration", func(t *testing.T) {
		data, err := os.ReadFile(filepath.Join(examples, "kubelet-config.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		// Strict: a misspelt field would be ignored by a kubelet merging the fragment.
		var cfg kubeletconfig.KubeletConfiguration
		if err := yaml.UnmarshalStrict(data, &cfg); err != nil {
			t.Fatalf("not a KubeletConfiguration: %v", err)
		}
		if cfg.Kind != "KubeletConfiguration" || cfg.APIVersion != kubeletconfig.SchemeGroupVersion.String() {
			t.Errorf("kind %s/%s, want %s/KubeletConfiguration", cfg.APIVersion, cfg.Kind, kubeletconfig.SchemeGroupVersion)
		}
		for name, m := range map[string]map[string]string{"evictionSoft": cfg.EvictionSoft, "evictionSoftGracePeriod": cfg.EvictionSoftGracePeriod, "evictionHard": cfg.EvictionHard} {
			if m["memory.available"] == "" {
				t.Errorf("%s sets no memory.available", name)
			}
		}
		// What the agent reads from the node's file (--kubelet-config) for its deadlines.
		settings, err := pressure.ReadKubeletConfig(data)
		if err != nil || settings.MaxPodGracePeriod != 60 || settings.MaxPodGracePeriod != int64(cfg.EvictionMaxPodGracePeriod) {
			t.Errorf("the agent reads evictionMaxPodGracePeriod %d (%v), want 60", settings.MaxPodGracePeriod, err)
		}
	})

	// The namespace for VMs enforces "restricted": the API server admits the launcher pods the VMI
	// controller builds (a VM of images, claims and cloud-init, and its migration target) and
	// refuses a privileged pod.
	t.Run("vm.yaml", func(t *testing.T) {
		data, err := os.ReadFile(filepath.Join(examples, "vm.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		vm := &v1alpha1.VirtualMachine{}
		if err := yaml.UnmarshalStrict(data, vm); err != nil {
			t.Fatal(err)
		}
		if vm.Spec.RunStrategy != v1alpha1.RunStrategyAlways || vm.Spec.Template.Spec.EvictionStrategy == nil || *vm.Spec.Template.Spec.EvictionStrategy != v1alpha1.EvictionStrategyLiveMigrate {
			t.Errorf("vm.yaml: run strategy %q, eviction strategy %v; want Always and LiveMigrate", vm.Spec.RunStrategy, vm.Spec.Template.Spec.EvictionStrategy)
		}
		if _, err := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachines(testNamespace(t)).Create(context.Background(), vm, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
			t.Errorf("the API server refuses vm.yaml: %v", err)
		}
	})
	t.Run("vmi-service.yaml", func(t *testing.T) {
		data, err := os.ReadFile(filepath.Join(examples, "vmi-service.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		svc := &corev1.Service{}
		if err := yaml.UnmarshalStrict(data, svc); err != nil {
			t.Fatal(err)
		}
		if _, err := cluster.Kube.CoreV1().Services(testNamespace(t)).Create(context.Background(), svc, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
			t.Errorf("the API server refuses vmi-service.yaml: %v", err)
		}
	})
	t.Run("vm-namespace.yaml", func(t *testing.T) {
		objs := install(t) // the controller's service account and policies
		data, err := os.ReadFile(filepath.Join(examples, "vm-namespace.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		ns := &corev1.Namespace{}
		if err := yaml.UnmarshalStrict(data, ns); err != nil {
			t.Fatal(err)
		}
		ns.GenerateName, ns.Name = ns.Name+"-", ""
		if ns, err = cluster.Kube.CoreV1().Namespaces().Create(context.Background(), ns, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cluster.Kube.CoreV1().Namespaces().Delete(context.Background(), ns.Name, metav1.DeleteOptions{})
		})
		vmi := &v1alpha1.VirtualMachineInstance{
			ObjectMeta: metav1.ObjectMeta{Name: "vm", Namespace: ns.Name},
			Spec: v1alpha1.VirtualMachineInstanceSpec{
				Memory: resource.MustParse("256Mi"),
				Boot:   v1alpha1.BootSource{Container: &v1alpha1.KernelBootContainer{Image: "example.org/kernel:1", KernelPath: "/vmlinuz"}},
				Disks:  []v1alpha1.Disk{{Name: "root"}, {Name: "data"}, {Name: "seed"}},
				Volumes: []v1alpha1.Volume{
					{Name: "root", ContainerDisk: &v1alpha1.ContainerDiskSource{Image: "example.org/disk:1"}},
					{Name: "data", PersistentVolumeClaim: &v1alpha1.PersistentVolumeClaimSource{ClaimName: "data"}},
					{Name: "seed", CloudInitNoCloud: &v1alpha1.CloudInitNoCloudSource{UserDataSecretRef: &corev1.LocalObjectReference{Name: "seed"}}},
				},
			},
		}
		// The pods' owner, for lifeboat-controller-pods.
		vmi, err = cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(ns.Name).Create(context.Background(), vmi, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		vmi.Status.NodeName = "node-1"
		opts := vmipods.PodOptions{Image: "lifeboat.dev/lifeboat-launcher:dev", Acceleration: "kvm"}
		source, err := vmipods.NewLauncherPod(vmi, opts, nil)
		if err != nil {
			t.Fatal(err)
		}
		target, err := vmipods.NewTargetPod(vmi, &v1alpha1.VirtualMachineInstanceMigration{ObjectMeta: metav1.ObjectMeta{Name: "m", UID: "9f"}}, opts, nil, false)
		if err != nil {
			t.Fatal(err)
		}
		dryRun := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
		controller := tokenClient(t, controllerSA, nil).CoreV1().Pods(ns.Name)
		for _, pod := range []*corev1.Pod{source, target} {
			if _, err := controller.Create(context.Background(), pod, dryRun); err != nil {
				t.Errorf("launcher pod %s refused in the restricted namespace: %v", pod.Name, err)
			}
		}
		// The QEMU probe runs as a launcher does: restricted too.
		for _, o := range objs {
			if key(o) != "DaemonSet lifeboat-system/lifeboat-qemu-probe" {
				continue
			}
			ds := &appsv1.DaemonSet{}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, ds); err != nil {
				t.Fatal(err)
			}
			probe := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "qemu-probe"}, Spec: ds.Spec.Template.Spec}
			if _, err := cluster.Kube.CoreV1().Pods(ns.Name).Create(context.Background(), probe, dryRun); err != nil {
				t.Errorf("the QEMU probe's pod refused in the restricted namespace: %v", err)
			}
		}
		// Created as an admin, without what only lifeboat's controller may set or ask for
		// (lifeboat-reserved-metadata, lifeboat-launcher-devices), so that Pod Security alone decides.
		privileged := source.DeepCopy()
		privileged.Name = "privileged"
		privileged.OwnerReferences = nil
		for _, m := range []map[string]string{privileged.Labels, privileged.Annotations} {
			maps.DeleteFunc(m, func(k, _ string) bool { return strings.HasPrefix(k, v1alpha1.GroupName+"/") })
		}
		privileged.Spec.Containers[0].Resources = corev1.ResourceRequirements{}
		privileged.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{Privileged: ptr.To(true)}
		if _, err := cluster.Kube.CoreV1().Pods(ns.Name).Create(context.Background(), privileged, dryRun); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), `violates PodSecurity "restricted`) {
			t.Errorf("a privileged launcher pod in the restricted namespace: %v, want it refused by Pod Security restricted", err)
		}
	})

	// One VMI per way to give a VM its disks; each is accepted as written.
	for file, strategy := range map[string]string{"vmi.yaml": "LiveMigrate", "vmi-containerdisk.yaml": "LiveMigrateIfPossible", "vmi-claim.yaml": "LiveMigrate", "vmi-node-paths.yaml": "LiveMigrate"} {
		t.Run(file, func(t *testing.T) {
			install(t) // the CRDs
			if file == "vmi-node-paths.yaml" {
				allowNodeDirectories(t, guestDir) // a lab admin's opt-in, which the example says it needs
			}
			data, err := os.ReadFile(filepath.Join(examples, file))
			if err != nil {
				t.Fatal(err)
			}
			vmi := &unstructured.Unstructured{}
			if err := yaml.Unmarshal(data, &vmi.Object); err != nil {
				t.Fatal(err)
			}
			vmi.SetNamespace(testNamespace(t))
			a, err := newApplier()
			if err != nil {
				t.Fatal(err)
			}
			got, err := a.apply(context.Background(), vmi)
			if err != nil {
				t.Fatalf("the example VMI is refused: %v", err)
			}
			if s, _, _ := unstructured.NestedString(got.Object, "spec", "evictionStrategy"); s != strategy {
				t.Errorf("stored evictionStrategy %q, want %s", s, strategy)
			}
		})
	}
}

func testNamespace(t *testing.T) string { return cluster.Namespace(t, "manifests-") }
