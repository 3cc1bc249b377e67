package evacuate

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	kubefake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	lifeboatfake "github.com/lifeboat-vm/lifeboat/api/client/clientset/versioned/fake"
	lifeboatinformers "github.com/lifeboat-vm/lifeboat/api/client/informers/externalversions"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

// TestMigrationsCountBeforeTheCacheShowsThem: migrations the controller just created count
// against the parallel limits although its cache does not show them yet (the drain benchmark
// saw three migrations leave a node whose limit is two). None is made ahead while their targets
// are not ready.
func TestMigrationsCountBeforeTheCacheShowsThem(t *testing.T) {
	vmis := []*v1alpha1.VirtualMachineInstance{markedVMI("a", "n1", "Drain", 0), markedVMI("b", "n1", "Drain", 0), markedVMI("c", "n1", "Drain", 0)}
	cfg := config(5, 2)
	cfg.Name = v1alpha1.ConfigName
	client := lifeboatfake.NewSimpleClientset()
	created := 0
	// The fake API server does not fill in generateName.
	client.PrependReactor("create", "virtualmachineinstancemigrations", func(a k8stesting.Action) (bool, runtime.Object, error) {
		m := a.(k8stesting.CreateAction).GetObject().(*v1alpha1.VirtualMachineInstanceMigration)
		created++
		m.Name = fmt.Sprintf("%s%d", m.GenerateName, created)
		return false, nil, nil
	})
	// The informers never run: their caches hold what the test puts there, as a cache that
	// lags behind the API server would.
	factory := lifeboatinformers.NewSharedInformerFactory(client, 0)
	vmiInformer, migInformer, cfgInformer := factory.Lifeboat().V1alpha1().VirtualMachineInstances(),
		factory.Lifeboat().V1alpha1().VirtualMachineInstanceMigrations(), factory.Lifeboat().V1alpha1().LifeboatConfigs()
	for _, v := range vmis {
		_ = vmiInformer.Informer().GetIndexer().Add(v)
	}
	_ = cfgInformer.Informer().GetIndexer().Add(cfg)
	nodes, pods := NewCapacityInformers(kubefake.NewClientset())
	addNodes(nodes, "n1", "n2")
	c := New(client, vmiInformer, migInformer, cfgInformer, nodes, pods, record.NewFakeRecorder(100), slog.New(slog.NewTextHandler(io.Discard, nil)))

	ctx := context.Background()
	for range 3 {
		if _, err := c.sync(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if created != 2 {
		t.Fatalf("created %d migrations before the cache showed any, want 2 (parallelOutboundMigrationsPerNode)", created)
	}
	list, err := client.LifeboatV1alpha1().VirtualMachineInstanceMigrations("ns").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	moving := 0
	for i := range list.Items {
		m := &list.Items[i]
		if !m.WaitingForSlot() {
			moving++
		}
		if got, want := m.EvacuatedVMI(), "uid-"+m.Spec.VMIName; string(got) != want {
			t.Errorf("migration %s records that it evacuates VMI %q, want %q", m.Name, got, want)
		}
		_ = migInformer.Informer().GetIndexer().Add(m)
	}
	if moving != 2 {
		t.Errorf("%d of the migrations may move memory, want 2 (parallelOutboundMigrationsPerNode)", moving)
	}
	if _, err := c.sync(ctx); err != nil {
		t.Fatal(err)
	}
	if created != 2 {
		t.Errorf("created %d migrations once the cache showed the first two, want still 2", created)
	}
}

// addNodes puts VM nodes in the node cache.
func addNodes(nodes cache.SharedIndexInformer, names ...string) {
	for _, n := range names {
		_ = nodes.GetIndexer().Add(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n, Labels: map[string]string{
			v1alpha1.LabelKVMNode: "true", corev1.LabelHostname: n}}})
	}
}

// TestAnUnrecordedMigrationIsDeleted: a migration the controller could not record as its own
// would pass for a person's, outside the evacuation limits; it is deleted and tried again.
func TestAnUnrecordedMigrationIsDeleted(t *testing.T) {
	v := markedVMI("a", "n1", "NodePressure", 30)
	client := lifeboatfake.NewSimpleClientset()
	client.PrependReactor("create", "virtualmachineinstancemigrations", func(a k8stesting.Action) (bool, runtime.Object, error) {
		m := a.(k8stesting.CreateAction).GetObject().(*v1alpha1.VirtualMachineInstanceMigration)
		m.Name, m.UID = m.GenerateName+"x", "mig-uid"
		return false, nil, nil
	})
	client.PrependReactor("update", "virtualmachineinstancemigrations", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() == "status" {
			return true, nil, errors.New("the API server is unavailable")
		}
		return false, nil, nil
	})
	factory := lifeboatinformers.NewSharedInformerFactory(client, 0)
	vmiInformer := factory.Lifeboat().V1alpha1().VirtualMachineInstances()
	_ = vmiInformer.Informer().GetIndexer().Add(v)
	nodes, pods := NewCapacityInformers(kubefake.NewClientset())
	addNodes(nodes, "n1", "n2")
	recorder := record.NewFakeRecorder(10)
	c := New(client, vmiInformer, factory.Lifeboat().V1alpha1().VirtualMachineInstanceMigrations(), factory.Lifeboat().V1alpha1().LifeboatConfigs(),
		nodes, pods, recorder, slog.New(slog.NewTextHandler(io.Discard, nil)))

	if _, err := c.sync(context.Background()); err == nil {
		t.Error("sync succeeded although the migration could not be recorded; want an error, so that it is retried")
	}
	list, err := client.LifeboatV1alpha1().VirtualMachineInstanceMigrations("ns").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 0 {
		t.Errorf("the unrecorded migration was left: %v", list.Items)
	}
	select {
	case e := <-recorder.Events:
		if !strings.Contains(e, ReasonFailedToMigrate) {
			t.Errorf("event %q, want %s", e, ReasonFailedToMigrate)
		}
	default:
		t.Errorf("no Event told the VMI's owner")
	}
}
