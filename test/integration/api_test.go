package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	apiextensions "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/test/controlplane"
)

func testNamespace(t *testing.T) string { return cluster.Namespace(t, "api-") }

func exampleVMI(name string) *v1alpha1.VirtualMachineInstance {
	return &v1alpha1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1alpha1.VirtualMachineInstanceSpec{
			CPUs:             1,
			Memory:           resource.MustParse("128Mi"),
			Boot:             v1alpha1.BootSource{Kernel: "/var/lib/lifeboat/vmlinuz", Initrd: "/var/lib/lifeboat/initrd.gz", Cmdline: "console=ttyS0"},
			EvictionStrategy: ptr.To(v1alpha1.EvictionStrategyLiveMigrate),
		},
	}
}

func TestCRDsAreEstablished(t *testing.T) {
	client, err := apiextensions.NewForConfig(cluster.Config)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{
		"virtualmachineinstances.lifeboat.dev",
		"virtualmachineinstancemigrations.lifeboat.dev",
		"lifeboatconfigs.lifeboat.dev",
		"virtualmachines.lifeboat.dev",
	} {
		crd, err := client.ApiextensionsV1().CustomResourceDefinitions().Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			t.Errorf("CRD %s: %v", name, err)
			continue
		}
		if !controlplane.Established(crd) {
			t.Errorf("CRD %s is not Established: %+v", name, crd.Status.Conditions)
		}
	}

	resources, err := cluster.Kube.Discovery().ServerResourcesForGroupVersion("lifeboat.dev/v1alpha1")
	if err != nil {
		t.Fatalf("discovery of lifeboat.dev/v1alpha1: %v", err)
	}
	want := map[string]struct {
		namespaced bool
		shortName  string
	}{
		"virtualmachineinstances":          {true, "vmi"},
		"virtualmachineinstancemigrations": {true, "vmim"},
		"lifeboatconfigs":                  {false, ""},
		"virtualmachines":                  {true, "vm"},
	}
	for _, r := range resources.APIResources {
		w, ok := want[r.Name]
		if !ok {
			continue
		}
		delete(want, r.Name)
		if r.Namespaced != w.namespaced {
			t.Errorf("%s: namespaced = %v, want %v", r.Name, r.Namespaced, w.namespaced)
		}
		if w.shortName != "" && !contains(r.ShortNames, w.shortName) {
			t.Errorf("%s: short names %v lack %q", r.Name, r.ShortNames, w.shortName)
		}
	}
	if len(want) != 0 {
		t.Errorf("discovery does not serve %v", want)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// nextEvent waits for the watch's next event of the given type for the named object.
func nextEvent(t *testing.T, w watch.Interface, typ watch.EventType, name string) {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatalf("watch closed before a %s event for %s", typ, name)
			}
			if m, err := metaName(ev.Object); err == nil && ev.Type == typ && m == name {
				return
			}
		case <-timeout:
			t.Fatalf("no %s event for %s within 30s", typ, name)
		}
	}
}

func metaName(obj any) (string, error) {
	o, ok := obj.(metav1.Object)
	if !ok {
		return "", fmt.Errorf("%T has no metadata", obj)
	}
	return o.GetName(), nil
}

func TestVirtualMachineInstanceClient(t *testing.T) {
	ctx := context.Background()
	ns := testNamespace(t)
	vmis := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(ns)

	w, err := vmis.Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatalf("watch: %v", err)
	}
	defer w.Stop()

	created, err := vmis.Create(ctx, exampleVMI("vm1"), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	nextEvent(t, w, watch.Added, "vm1")

	got, err := vmis.Get(ctx, "vm1", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get: %v", err)
	}
	if got.Spec.Memory.Cmp(resource.MustParse("128Mi")) != 0 || got.Spec.CPUs != 1 || *got.Spec.EvictionStrategy != v1alpha1.EvictionStrategyLiveMigrate {
		t.Errorf("spec did not round-trip: %+v", got.Spec)
	}

	list, err := vmis.List(ctx, metav1.ListOptions{})
	if err != nil || len(list.Items) != 1 || list.Items[0].Name != "vm1" {
		t.Fatalf("list: %v, %d items", err, len(list.Items))
	}

	// Status goes through the status subresource only.
	withStatus := created.DeepCopy()
	withStatus.Status.Phase = v1alpha1.VMIRunning
	withStatus.Status.NodeName = "node-a"
	withStatus.Status.Conditions = []metav1.Condition{{
		Type: v1alpha1.VMIConditionLiveMigratable, Status: metav1.ConditionTrue, Reason: "Migratable", LastTransitionTime: metav1.Now(),
	}}
	withStatus.Status.MigrationState = &v1alpha1.VirtualMachineInstanceMigrationState{
		MigrationName: "m1", SourceNode: "node-a", TargetNode: "node-b", Cause: v1alpha1.MigrationCauseNodePressure, Mode: v1alpha1.MigrationModePreCopy,
	}
	updated, err := vmis.UpdateStatus(ctx, withStatus, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("update status: %v", err)
	}
	nextEvent(t, w, watch.Modified, "vm1")
	if updated.Status.Phase != v1alpha1.VMIRunning || updated.Status.NodeName != "node-a" ||
		updated.Status.MigrationState.Cause != v1alpha1.MigrationCauseNodePressure {
		t.Errorf("status did not round-trip: %+v", updated.Status)
	}

	// A spec update must not be able to change status.
	sneaky := updated.DeepCopy()
	sneaky.Status.NodeName = "node-z"
	sneaky.Spec.CPUs = 2
	afterUpdate, err := vmis.Update(ctx, sneaky, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("update: %v", err)
	}
	if afterUpdate.Spec.CPUs != 2 || afterUpdate.Status.NodeName != "node-a" {
		t.Errorf("update: cpus = %d (want 2), nodeName = %q (want node-a: status is a subresource)", afterUpdate.Spec.CPUs, afterUpdate.Status.NodeName)
	}

	if err := vmis.Delete(ctx, "vm1", metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete: %v", err)
	}
	nextEvent(t, w, watch.Deleted, "vm1")
}

func TestVirtualMachineInstanceMigrationClient(t *testing.T) {
	ctx := context.Background()
	ns := testNamespace(t)
	vmims := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstanceMigrations(ns)

	w, err := vmims.Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatalf("watch: %v", err)
	}
	defer w.Stop()

	created, err := vmims.Create(ctx, &v1alpha1.VirtualMachineInstanceMigration{
		ObjectMeta: metav1.ObjectMeta{Name: "mig1"},
		Spec:       v1alpha1.VirtualMachineInstanceMigrationSpec{VMIName: "vm1"},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	nextEvent(t, w, watch.Added, "mig1")

	deadline := metav1.NewTime(time.Now().Add(5 * time.Minute).Truncate(time.Second))
	st := created.DeepCopy()
	st.Status = v1alpha1.VirtualMachineInstanceMigrationStatus{
		Phase: v1alpha1.MigrationRunning, Cause: v1alpha1.MigrationCauseNodePressure, Deadline: &deadline,
		SourceNode: "node-a", TargetNode: "node-b", TargetPod: "launcher-vm1-xyz", Mode: v1alpha1.MigrationModeAutoConverge,
		PhaseTransitionTimestamps: []v1alpha1.MigrationPhaseTransition{{Phase: v1alpha1.MigrationRunning, Timestamp: metav1.Now()}},
	}
	updated, err := vmims.UpdateStatus(ctx, st, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("update status: %v", err)
	}
	nextEvent(t, w, watch.Modified, "mig1")
	if !updated.Status.Deadline.Equal(&deadline) || updated.Status.Mode != v1alpha1.MigrationModeAutoConverge {
		t.Errorf("status did not round-trip: %+v", updated.Status)
	}

	got, err := vmims.Get(ctx, "mig1", metav1.GetOptions{})
	if err != nil || got.Status.Phase != v1alpha1.MigrationRunning {
		t.Fatalf("get: %v, phase %q", err, got.Status.Phase)
	}
	list, err := vmims.List(ctx, metav1.ListOptions{})
	if err != nil || len(list.Items) != 1 {
		t.Fatalf("list: %v, %d items", err, len(list.Items))
	}
	// Agents list only the migrations leaving or reaching their node.
	for selector, want := range map[string]int{
		"status.sourceNode=node-a": 1, "status.targetNode=node-b": 1, "status.sourceNode=node-b": 0, "status.targetNode=node-a": 0,
	} {
		list, err := vmims.List(ctx, metav1.ListOptions{FieldSelector: selector})
		if err != nil || len(list.Items) != want {
			t.Errorf("list with field selector %s: %v, %d items; want %d", selector, err, len(list.Items), want)
		}
	}

	changed := got.DeepCopy()
	changed.Spec.VMIName = "another"
	if _, err := vmims.Update(ctx, changed, metav1.UpdateOptions{}); err == nil || !strings.Contains(err.Error(), "vmiName cannot be changed") {
		t.Errorf("changing spec.vmiName: got %v, want an error saying vmiName cannot be changed", err)
	}
}

func TestLifeboatConfigClientAndDefaults(t *testing.T) {
	ctx := context.Background()
	configs := cluster.Lifeboat.LifeboatV1alpha1().LifeboatConfigs()

	w, err := configs.Watch(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatalf("watch: %v", err)
	}
	defer w.Stop()

	created, err := configs.Create(ctx, &v1alpha1.LifeboatConfig{ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.ConfigName}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	t.Cleanup(func() { _ = configs.Delete(context.Background(), v1alpha1.ConfigName, metav1.DeleteOptions{}) })
	nextEvent(t, w, watch.Added, v1alpha1.ConfigName)

	if got := v1alpha1.UnauthenticatedMigrationInterval(created); got != time.Hour {
		t.Errorf("spec.evictionWebhook.unauthenticatedMigrationInterval defaulted to %s, want 1h", got)
	}
	m := created.Spec.Migrations
	if m.ParallelMigrationsPerCluster == nil || *m.ParallelMigrationsPerCluster != 5 ||
		m.ParallelOutboundMigrationsPerNode == nil || *m.ParallelOutboundMigrationsPerNode != 2 {
		t.Errorf("migration limits not defaulted to 5 per cluster and 2 per node: %+v", m)
	}
	if m.AllowAutoConverge == nil || !*m.AllowAutoConverge || m.AllowPostCopy == nil || *m.AllowPostCopy || m.AllowPause == nil || !*m.AllowPause {
		t.Errorf("convergence switches not defaulted to autoConverge=true postCopy=false pause=true: %+v", m)
	}

	created.Spec.FeatureGates = []v1alpha1.FeatureGate{v1alpha1.FeatureGateNodePressureEvictionLiveMigration}
	created.Spec.EvictionStrategy = ptr.To(v1alpha1.EvictionStrategyLiveMigrateIfPossible)
	bw := resource.MustParse("64Mi")
	created.Spec.Migrations.BandwidthPerMigration = &bw
	if _, err := configs.Update(ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("update: %v", err)
	}
	nextEvent(t, w, watch.Modified, v1alpha1.ConfigName)

	list, err := configs.List(ctx, metav1.ListOptions{})
	if err != nil || len(list.Items) != 1 {
		t.Fatalf("list: %v", err)
	}
	got := list.Items[0]
	if len(got.Spec.FeatureGates) != 1 || got.Spec.FeatureGates[0] != v1alpha1.FeatureGateNodePressureEvictionLiveMigration ||
		*got.Spec.EvictionStrategy != v1alpha1.EvictionStrategyLiveMigrateIfPossible || got.Spec.Migrations.BandwidthPerMigration.Cmp(bw) != 0 {
		t.Errorf("update did not round-trip: %+v", got.Spec)
	}
}

// TestInvalidInputIsRejected sends what a person might write with kubectl and checks the
// API server refuses it with a message that says what is wrong.
func TestInvalidInputIsRejected(t *testing.T) {
	ns := testNamespace(t)
	dyn, err := dynamic.NewForConfig(cluster.Config)
	if err != nil {
		t.Fatal(err)
	}
	const vmi = `
apiVersion: lifeboat.dev/v1alpha1
kind: VirtualMachineInstance
metadata: {name: bad}
spec:
  cpus: %s
  memory: %s
  evictionStrategy: %s
  boot: %s
`
	const config = `
apiVersion: lifeboat.dev/v1alpha1
kind: LifeboatConfig
metadata: {name: %s}
spec: %s
`
	good := []any{"1", "128Mi", "LiveMigrate", "{kernel: /k}"}
	vmiWith := func(i int, v string) string {
		args := append([]any(nil), good...)
		args[i] = v
		return fmt.Sprintf(vmi, args...)
	}
	withSpec := func(extra string) string {
		return strings.Replace(vmiWith(3, "{kernel: /k}"), "spec:", "spec:\n  "+extra, 1)
	}
	const strategies = `supported values: "None", "LiveMigrate", "LiveMigrateIfPossible", "External"`
	cases := []struct {
		name string
		yaml string
		want []string
	}{
		{"unknown eviction strategy", vmiWith(2, "Sometimes"), []string{`spec.evictionStrategy: Unsupported value: "Sometimes"`, strategies}},
		{"zero memory", vmiWith(1, "0"), []string{"spec.memory", "memory must be greater than zero"}},
		{"negative memory", vmiWith(1, "-1Gi"), []string{"spec.memory", "memory must be greater than zero"}},
		{"memory that is not a quantity", vmiWith(1, "lots"), []string{"spec.memory"}},
		{"zero CPUs", vmiWith(0, "0"), []string{"spec.cpus", "should be greater than or equal to 1"}},
		{"negative CPUs", vmiWith(0, "-2"), []string{"spec.cpus", "should be greater than or equal to 1"}},
		{"no boot source", vmiWith(3, "{cmdline: quiet}"), []string{"the VM boots nothing", "boot.cmdline needs boot.kernel or boot.container"}},
		{"a kernel image and a node kernel", vmiWith(3, "{kernel: /k, container: {image: example.org/k, kernelPath: /vmlinuz}}"), []string{"boot.container holds the kernel and initrd"}},
		{"a relative kernel path in the image", vmiWith(3, "{container: {image: example.org/k, kernelPath: vmlinuz}}"), []string{"kernelPath must be an absolute path inside the image"}},
		{"a kernel path climbing out of the image", vmiWith(3, "{container: {image: example.org/k, kernelPath: /boot/../../etc/shadow}}"), []string{"kernelPath must be an absolute path inside the image, without .."}},
		{"a disk without its volume", withSpec("disks: [{name: root}]"), []string{"every disk names a volume of spec.volumes"}},
		{"a volume without its disk", withSpec("volumes: [{name: root, containerDisk: {image: example.org/d}}]"), []string{"every volume is attached by a disk"}},
		{"a volume with two sources", withSpec("disks: [{name: v}]\n  volumes: [{name: v, containerDisk: {image: example.org/d}, cloudInitNoCloud: {userData: x}}]"), []string{"a volume needs exactly one source"}},
		{"a volume with no source", withSpec("disks: [{name: v}]\n  volumes: [{name: v}]"), []string{"a volume needs exactly one source"}},
		{"two cloud-init seeds", withSpec("disks: [{name: a}, {name: b}]\n  volumes: [{name: a, cloudInitNoCloud: {userData: one}}, {name: b, cloudInitNoCloud: {userData: two}}]"), []string{"at most one cloudInitNoCloud volume"}},
		{"a volume name that is no DNS label", withSpec("disks: [{name: Root_Disk}]\n  volumes: [{name: Root_Disk, containerDisk: {image: example.org/d}}]"), []string{"spec.disks[0].name", "should match"}},
		{"a containerDisk path climbing out", withSpec("disks: [{name: v}]\n  volumes: [{name: v, containerDisk: {image: example.org/d, path: /disk/../../etc/shadow}}]"), []string{"path must be an absolute path inside the image"}},
		{"inline user data and a Secret's", withSpec("disks: [{name: v}]\n  volumes: [{name: v, cloudInitNoCloud: {userData: one, userDataSecretRef: {name: s}}}]"), []string{"cloudInitNoCloud takes userData or userDataSecretRef, not both"}},
		{"an unknown disk bus", withSpec("disks: [{name: v, bus: scsi}]\n  volumes: [{name: v, containerDisk: {image: example.org/d}}]"), []string{`Unsupported value: "scsi"`}},
		{"initrd without kernel", vmiWith(3, "{disk: /d, initrd: /i}"), []string{"boot.initrd needs boot.kernel"}},
		{"a node selector on lifeboat's own node label", strings.Replace(vmiWith(3, "{kernel: /k}"), "spec:", "spec:\n  nodeSelector: {lifeboat.dev/kvm: \"false\"}", 1),
			[]string{"spec.nodeSelector", "nodeSelector cannot name lifeboat.dev/ keys: they are lifeboat's"}},
		{"a node selector on another lifeboat.dev key", strings.Replace(vmiWith(3, "{kernel: /k}"), "spec:", "spec:\n  nodeSelector: {lifeboat.dev/relief: \"none\"}", 1),
			[]string{"spec.nodeSelector", "nodeSelector cannot name lifeboat.dev/ keys"}},
		{"an interface on an unknown network", withSpec("interfaces: [{name: default, masquerade: {}}]\n  networks: [{name: other, pod: {}}]"),
			[]string{"every interface names a network of spec.networks", "every network is attached by an interface"}},
		{"two interfaces on the pod network", withSpec("interfaces: [{name: a, masquerade: {}}, {name: b, masquerade: {}}]\n  networks: [{name: a, pod: {}}, {name: b, pod: {}}]"),
			[]string{"a VM has at most one interface on the pod network"}},
		{"a port out of range", withSpec("interfaces: [{name: default, masquerade: {}, ports: [{port: 70000}]}]\n  networks: [{name: default, pod: {}}]"),
			[]string{"spec.interfaces[0].ports[0].port", "less than or equal to 65535"}},
		{"port zero", withSpec("interfaces: [{name: default, masquerade: {}, ports: [{port: 0}]}]\n  networks: [{name: default, pod: {}}]"),
			[]string{"spec.interfaces[0].ports[0].port", "greater than or equal to 1"}},
		{"an unknown port protocol", withSpec("interfaces: [{name: default, masquerade: {}, ports: [{port: 80, protocol: ICMP}]}]\n  networks: [{name: default, pod: {}}]"),
			[]string{`Unsupported value: "ICMP"`, `supported values: "TCP", "UDP"`}},
		{"an interface with two bindings", withSpec("interfaces: [{name: default, masquerade: {}, bridge: {}}]\n  networks: [{name: default, pod: {}}]"),
			[]string{"an interface needs exactly one binding: masquerade or bridge"}},
		{"an interface with no binding", withSpec("interfaces: [{name: default}]\n  networks: [{name: default, pod: {}}]"),
			[]string{"an interface needs exactly one binding: masquerade or bridge"}},
		{"ports on a bridge binding", withSpec("interfaces: [{name: default, bridge: {}, ports: [{port: 80}]}]\n  networks: [{name: default, pod: {}}]"),
			[]string{"ports are for the masquerade binding"}},
		{"a MAC address on a bridge binding", withSpec("interfaces: [{name: default, bridge: {}, macAddress: 0a:58:0a:f4:09:07}]\n  networks: [{name: default, pod: {}}]"),
			[]string{"spec.interfaces[0]", "macAddress is for the masquerade binding: a bridge binding gives the guest the pod's own MAC"}},
		{"a network of no kind", withSpec("interfaces: [{name: default, masquerade: {}}]\n  networks: [{name: default}]"),
			[]string{"a network needs a kind: pod"}},
		{"a MAC address that is not one", withSpec("interfaces: [{name: default, masquerade: {}, macAddress: 02-00-00}]\n  networks: [{name: default, pod: {}}]"),
			[]string{"spec.interfaces[0].macAddress", "should match"}},
		{"config not named cluster", fmt.Sprintf(config, "mine", "{}"), []string{"the LifeboatConfig must be named 'cluster'"}},
		{"config with unknown eviction strategy", fmt.Sprintf(config, "cluster", "{evictionStrategy: Always}"), []string{`spec.evictionStrategy: Unsupported value: "Always"`, strategies}},
		{"config with unknown feature gate", fmt.Sprintf(config, "cluster", "{featureGates: [NodePressureEviction]}"), []string{`Unsupported value: "NodePressureEviction"`, `supported values: "NodePressureEvictionLiveMigration"`}},
		{"config with zero parallel migrations", fmt.Sprintf(config, "cluster", "{migrations: {parallelMigrationsPerCluster: 0}}"), []string{"spec.migrations.parallelMigrationsPerCluster", "greater than or equal to 1"}},
		{"config with negative bandwidth", fmt.Sprintf(config, "cluster", "{migrations: {bandwidthPerMigration: -1Mi}}"), []string{"bandwidthPerMigration cannot be negative"}},
		{"config with a forged review's interval under a minute", fmt.Sprintf(config, "cluster", "{evictionWebhook: {unauthenticatedMigrationInterval: 30s}}"), []string{"unauthenticatedMigrationInterval must be at least 1m"}},
		{"config with a forged review's interval that is no duration", fmt.Sprintf(config, "cluster", "{evictionWebhook: {unauthenticatedMigrationInterval: hourly}}"), []string{"spec.evictionWebhook.unauthenticatedMigrationInterval"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			obj := &unstructured.Unstructured{}
			if err := yaml.Unmarshal([]byte(tc.yaml), &obj.Object); err != nil {
				t.Fatalf("test YAML: %v", err)
			}
			gvr := schema.GroupVersionResource{Group: v1alpha1.GroupName, Version: "v1alpha1", Resource: "virtualmachineinstances"}
			var client dynamic.ResourceInterface = dyn.Resource(gvr).Namespace(ns)
			if obj.GetKind() == "LifeboatConfig" {
				gvr.Resource = "lifeboatconfigs"
				client = dyn.Resource(gvr)
			}
			_, err := client.Create(context.Background(), obj, metav1.CreateOptions{})
			if err == nil {
				t.Fatalf("the API server accepted:\n%s", tc.yaml)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q\ndoes not contain %q", err, w)
				}
			}
		})
	}
}

func TestPrinterColumns(t *testing.T) {
	ctx := context.Background()
	ns := testNamespace(t)
	vmis := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(ns)
	vmi, err := vmis.Create(ctx, exampleVMI("printed"), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	vmi.Status.Phase = v1alpha1.VMIRunning
	vmi.Status.NodeName = "node-a"
	vmi.Status.EvacuationNodeName = "node-a"
	if _, err := vmis.UpdateStatus(ctx, vmi, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	vmims := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstanceMigrations(ns)
	mig, err := vmims.Create(ctx, &v1alpha1.VirtualMachineInstanceMigration{
		ObjectMeta: metav1.ObjectMeta{Name: "printed-mig"},
		Spec:       v1alpha1.VirtualMachineInstanceMigrationSpec{VMIName: "printed"},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	mig.Status = v1alpha1.VirtualMachineInstanceMigrationStatus{
		Phase: v1alpha1.MigrationRunning, Cause: v1alpha1.MigrationCauseNodePressure, SourceNode: "node-a", TargetNode: "node-b",
	}
	if _, err := vmims.UpdateStatus(ctx, mig, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	cases := []struct {
		resource string
		header   []string
		row      []string
	}{
		{"vmi", []string{"NAME", "PHASE", "NODE", "EVACUATION NODE", "AGE"}, []string{"printed", "Running", "node-a", "node-a"}},
		{"vmim", []string{"NAME", "VMI", "CAUSE", "PHASE", "SOURCE", "TARGET", "AGE"}, []string{"printed-mig", "printed", "NodePressure", "Running", "node-a", "node-b"}},
	}
	for _, tc := range cases {
		out, err := cluster.Kubectl(ctx, "get", tc.resource, "-n", ns)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) != 2 {
			t.Fatalf("kubectl get %s: want a header and one row, got:\n%s", tc.resource, out)
		}
		if got := splitColumns(lines[0]); strings.Join(got, "|") != strings.Join(tc.header, "|") {
			t.Errorf("kubectl get %s header = %q, want %q", tc.resource, got, tc.header)
		}
		if got := strings.Fields(lines[1]); len(got) < len(tc.row) || strings.Join(got[:len(tc.row)], "|") != strings.Join(tc.row, "|") {
			t.Errorf("kubectl get %s row = %q, want it to start with %q", tc.resource, got, tc.row)
		}
	}
}

// kubectl get lifeboatconfig shows its conditions (issue 46): Ready, whether the webhook is
// strict and whether VMs are at risk; -o wide adds Ready's reason and the webhook mode's.
func TestLifeboatConfigPrinterColumns(t *testing.T) {
	ctx := context.Background()
	configs := cluster.Lifeboat.LifeboatV1alpha1().LifeboatConfigs()
	c, err := configs.Create(ctx, &v1alpha1.LifeboatConfig{ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.ConfigName},
		Spec: v1alpha1.LifeboatConfigSpec{EvictionStrategy: ptr.To(v1alpha1.EvictionStrategyLiveMigrate)}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = configs.Delete(context.Background(), v1alpha1.ConfigName, metav1.DeleteOptions{}) })
	now := metav1.Now()
	c.Status.Conditions = []metav1.Condition{
		{Type: v1alpha1.ConfigConditionReady, Status: metav1.ConditionFalse, Reason: "WebhookNotRegistered", Message: "m", LastTransitionTime: now},
		{Type: v1alpha1.ConfigConditionEvictionWebhookStrict, Status: metav1.ConditionFalse, Reason: "NoAuthenticatedCallSeen", Message: "m", LastTransitionTime: now},
		{Type: v1alpha1.ConfigConditionVMsAtRisk, Status: metav1.ConditionTrue, Reason: "NodesAtRisk", Message: "m", LastTransitionTime: now},
	}
	if _, err := configs.UpdateStatus(ctx, c, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args        []string
		header, row []string
	}{
		{[]string{"get", "lifeboatconfig"}, []string{"NAME", "READY", "WEBHOOK STRICT", "VMS AT RISK", "EVICTION STRATEGY", "FEATURE GATES", "AGE"},
			[]string{"cluster", "False", "False", "True", "LiveMigrate"}},
		{[]string{"get", "lifeboatconfig", "-o", "wide"}, []string{"NAME", "READY", "WEBHOOK STRICT", "VMS AT RISK", "EVICTION STRATEGY", "FEATURE GATES", "AGE", "REASON", "WEBHOOK REASON"},
			[]string{"cluster", "False", "False", "True", "LiveMigrate"}},
	} {
		out, err := cluster.Kubectl(ctx, tc.args...)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("kubectl %s:\n%s", strings.Join(tc.args, " "), out)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) != 2 {
			t.Fatalf("kubectl %s: want a header and one row, got:\n%s", strings.Join(tc.args, " "), out)
		}
		if got := splitColumns(lines[0]); strings.Join(got, "|") != strings.Join(tc.header, "|") {
			t.Errorf("kubectl %s header = %q, want %q", strings.Join(tc.args, " "), got, tc.header)
		}
		if got := strings.Fields(lines[1]); len(got) < len(tc.row) || strings.Join(got[:len(tc.row)], "|") != strings.Join(tc.row, "|") {
			t.Errorf("kubectl %s row = %q, want it to start with %q", strings.Join(tc.args, " "), got, tc.row)
		}
		if wide := len(tc.args) > 2; wide && (!strings.Contains(lines[1], "WebhookNotRegistered") || !strings.Contains(lines[1], "NoAuthenticatedCallSeen")) {
			t.Errorf("kubectl get lifeboatconfig -o wide does not show the reasons: %s", lines[1])
		}
	}
}

// splitColumns splits a kubectl header on runs of two or more spaces (column names may contain one).
func splitColumns(line string) []string {
	var cols []string
	for _, c := range strings.Split(line, "  ") {
		if c = strings.TrimSpace(c); c != "" {
			cols = append(cols, c)
		}
	}
	return cols
}

// TestAVMOfImagesAndCloudInitIsAccepted: the shape a user brings (KubeVirt's disks and volumes)
// round-trips, with no boot section at all.
func TestAVMOfImagesAndCloudInitIsAccepted(t *testing.T) {
	vmis := cluster.Lifeboat.LifeboatV1alpha1().VirtualMachineInstances(testNamespace(t))
	v := &v1alpha1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{Name: "fedora"},
		Spec: v1alpha1.VirtualMachineInstanceSpec{
			Memory: resource.MustParse("1Gi"),
			Disks:  []v1alpha1.Disk{{Name: "root"}, {Name: "cloudinit", Bus: v1alpha1.DiskBusSATA}},
			Volumes: []v1alpha1.Volume{
				{Name: "root", ContainerDisk: &v1alpha1.ContainerDiskSource{Image: "quay.io/containerdisks/fedora:42"}},
				{Name: "cloudinit", CloudInitNoCloud: &v1alpha1.CloudInitNoCloudSource{UserData: "#cloud-config\npassword: fedora\n"}},
			},
		},
	}
	created, err := vmis.Create(context.Background(), v, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("a VMI of a containerDisk and a cloud-init seed: %v", err)
	}
	if created.Spec.CPUs != 1 || len(created.Spec.Volumes) != 2 || created.Spec.Volumes[0].ContainerDisk.Image != "quay.io/containerdisks/fedora:42" ||
		created.Spec.Volumes[1].CloudInitNoCloud.UserData != v.Spec.Volumes[1].CloudInitNoCloud.UserData {
		t.Errorf("the spec did not round-trip (with cpus defaulted to 1): %+v", created.Spec)
	}
}

// TestTheWebhooksRatchetCannotBeUndone: once the LifeboatConfig records that the API server
// authenticated to the eviction webhook, no write of its status (the controller's, a stolen
// token's, an admin's) removes or moves that record; only deleting the LifeboatConfig does.
func TestTheWebhooksRatchetCannotBeUndone(t *testing.T) {
	ctx := context.Background()
	configs := cluster.Lifeboat.LifeboatV1alpha1().LifeboatConfigs()
	c, err := configs.Create(ctx, &v1alpha1.LifeboatConfig{ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.ConfigName}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = configs.Delete(context.Background(), v1alpha1.ConfigName, metav1.DeleteOptions{}) })
	seen := metav1.NewTime(time.Now().Truncate(time.Second))
	c.Status.EvictionWebhook = &v1alpha1.EvictionWebhookStatus{AuthenticatedCallSeen: &seen}
	if c, err = configs.UpdateStatus(ctx, c, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("recording the first authenticated call: %v", err)
	}
	later := metav1.NewTime(seen.Add(time.Hour))
	for name, change := range map[string]func(*v1alpha1.LifeboatConfig){
		"removing the time":   func(c *v1alpha1.LifeboatConfig) { c.Status.EvictionWebhook.AuthenticatedCallSeen = nil },
		"removing the field":  func(c *v1alpha1.LifeboatConfig) { c.Status.EvictionWebhook = nil },
		"removing the status": func(c *v1alpha1.LifeboatConfig) { c.Status = v1alpha1.LifeboatConfigStatus{} },
		"moving the time":     func(c *v1alpha1.LifeboatConfig) { c.Status.EvictionWebhook.AuthenticatedCallSeen = &later },
	} {
		changed := c.DeepCopy()
		change(changed)
		_, err := configs.UpdateStatus(ctx, changed, metav1.UpdateOptions{})
		if err == nil || !strings.Contains(err.Error(), "authenticatedCallSeen cannot be changed or removed once set") {
			t.Errorf("%s: %v, want it refused", name, err)
		}
	}
	// The main resource's writes leave the status alone.
	c.Spec.EvictionStrategy = ptr.To(v1alpha1.EvictionStrategyLiveMigrate)
	if c, err = configs.Update(ctx, c, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("changing the spec: %v", err)
	}
	if c.Status.EvictionWebhook == nil || c.Status.EvictionWebhook.AuthenticatedCallSeen == nil || !c.Status.EvictionWebhook.AuthenticatedCallSeen.Equal(&seen) {
		t.Errorf("the record changed with the spec: %+v", c.Status)
	}
}
