package agent

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	coreinformers "k8s.io/client-go/informers/core/v1"
	kubefake "k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	lifeboatfake "github.com/lifeboat-vm/lifeboat/api/client/clientset/versioned/fake"
	lifeboatinformers "github.com/lifeboat-vm/lifeboat/api/client/informers/externalversions"
	lifeboatv1alpha1informers "github.com/lifeboat-vm/lifeboat/api/client/informers/externalversions/lifeboat/v1alpha1"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

// TestLinkPod: a VM's directory links only to a pod lifeboat's controller recorded for it, in
// the VMI's namespace and controlled by the VMI; look-alikes (its labels, its name, its owner
// reference, in its namespace or another) get nothing and are reported; a connected launcher's
// link is never re-pointed.
func TestLinkPod(t *testing.T) {
	t0 := time.Date(2026, 11, 25, 10, 0, 0, 0, time.UTC)
	const vmiUID = "victim"
	type podOpt func(*corev1.Pod)
	pod := func(uid string, opts ...podOpt) *corev1.Pod {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "tenant", Name: "launcher-vm-" + uid, UID: types.UID(uid), CreationTimestamp: metav1.NewTime(t0),
				Labels: map[string]string{v1alpha1.LabelRole: v1alpha1.RoleLauncher, v1alpha1.LabelVMIUID: vmiUID},
				OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(&v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Name: "vm", UID: vmiUID}},
					v1alpha1.SchemeGroupVersion.WithKind("VirtualMachineInstance"))}},
			Status: corev1.PodStatus{Phase: corev1.PodRunning},
		}
		for _, o := range opts {
			o(p)
		}
		return p
	}
	created := func(d time.Duration) podOpt {
		return func(p *corev1.Pod) { p.CreationTimestamp = metav1.NewTime(t0.Add(d)) }
	}
	phase := func(ph corev1.PodPhase) podOpt { return func(p *corev1.Pod) { p.Status.Phase = ph } }
	inNamespace := func(ns string) podOpt { return func(p *corev1.Pod) { p.Namespace = ns } }
	named := func(name string) podOpt { return func(p *corev1.Pod) { p.Name = name } }
	uncontrolled := func(p *corev1.Pod) { p.OwnerReferences = nil }
	rec := func(p *corev1.Pod) RecordedPod { return RecordedPod{Namespace: p.Namespace, Name: p.Name, UID: p.UID} }
	recs := func(pods ...*corev1.Pod) []RecordedPod {
		var r []RecordedPod
		for _, p := range pods {
			r = append(r, rec(p))
		}
		return r
	}

	real := pod("real")
	tests := []struct {
		name          string
		recorded      []RecordedPod
		pods          []*corev1.Pod
		current       *corev1.Pod
		held          bool
		want          string   // pod UID; "" for no link
		wantImpostors []string // pod UIDs
	}{
		{name: "no pod: no link"},
		{name: "the recorded pod", recorded: recs(real), pods: []*corev1.Pod{real}, want: "real"},
		{name: "a pending recorded pod (its volume may not exist yet)", recorded: recs(pod("a", phase(corev1.PodPending))),
			pods: []*corev1.Pod{pod("a", phase(corev1.PodPending))}, want: "a"},
		{name: "a recorded pod that ended keeps its files until deleted", recorded: recs(pod("a")),
			pods: []*corev1.Pod{pod("a", phase(corev1.PodSucceeded))}, want: "a"},

		{name: "a labelled pod nobody recorded is no launcher, however new",
			pods: []*corev1.Pod{pod("lookalike", uncontrolled, created(time.Minute))}, wantImpostors: []string{"lookalike"}},
		{name: "a newer look-alike in another namespace does not displace the recorded pod", recorded: recs(real),
			pods: []*corev1.Pod{real, pod("lookalike", inNamespace("attacker"), uncontrolled, created(time.Minute))},
			want: "real", wantImpostors: []string{"lookalike"}},
		{name: "a newer look-alike in the VMI's namespace does not displace it", recorded: recs(real),
			pods: []*corev1.Pod{real, pod("lookalike", uncontrolled, created(time.Minute))}, want: "real", wantImpostors: []string{"lookalike"}},
		{name: "nor one that forges the VMI as its controller in another namespace", recorded: recs(real),
			pods: []*corev1.Pod{real, pod("forged", inNamespace("attacker"), created(time.Minute))}, want: "real", wantImpostors: []string{"forged"}},
		{name: "a pod under the recorded name but another UID (deleted and made again) is not the recorded one",
			recorded: recs(real), pods: []*corev1.Pod{pod("again", named(real.Name), uncontrolled)}, wantImpostors: []string{"again"}},
		{name: "a recorded name and UID the VMI does not control is not its launcher",
			recorded: recs(real), pods: []*corev1.Pod{pod("real", uncontrolled)}, wantImpostors: []string{"real"}},
		{name: "an unrecorded pod the VMI controls in its namespace waits for its record, unreported",
			recorded: recs(real), pods: []*corev1.Pod{real, pod("target", created(time.Minute))}, want: "real"},
		{name: "before any record, a pod the VMI controls is not reported (a target pod before its migration names it)",
			pods: []*corev1.Pod{pod("target")}},

		{name: "a migration's recorded target after an old target that failed here",
			recorded: recs(pod("old"), pod("new")), pods: []*corev1.Pod{pod("old", phase(corev1.PodFailed)), pod("new", created(time.Minute))}, want: "new"},
		{name: "a running pod wins over a newer recorded one that already ended",
			recorded: recs(pod("newer"), pod("running")), pods: []*corev1.Pod{pod("newer", created(time.Minute), phase(corev1.PodFailed)), pod("running")}, want: "running"},
		{name: "of two that ended, the newer",
			recorded: recs(pod("new"), pod("old")), pods: []*corev1.Pod{pod("new", created(time.Minute), phase(corev1.PodFailed)), pod("old", phase(corev1.PodSucceeded))}, want: "new"},

		{name: "a connected launcher's link is never re-pointed, even to a recorded pod",
			recorded: recs(real, pod("new")), pods: []*corev1.Pod{real, pod("new", created(time.Minute))}, current: real, held: true, want: "real"},
		{name: "once its launcher is gone, the newer recorded pod takes the link",
			recorded: recs(pod("old"), pod("new")), pods: []*corev1.Pod{pod("old", phase(corev1.PodFailed)), pod("new", created(time.Minute))}, current: pod("old", phase(corev1.PodFailed)), want: "new"},
		{name: "a source whose guest left keeps its link until it goes, no longer recorded",
			pods: []*corev1.Pod{real}, current: real, want: "real"},
		{name: "and a look-alike then gets nothing",
			pods: []*corev1.Pod{real, pod("lookalike", inNamespace("attacker"), uncontrolled, created(time.Minute))}, current: real, want: "real", wantImpostors: []string{"lookalike"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := LinkPod(vmiUID, tt.recorded, tt.pods, tt.current, tt.held)
			gotUID := ""
			if got.Pod != nil {
				gotUID = string(got.Pod.UID)
			}
			var impostors []string
			for _, p := range got.Impostors {
				impostors = append(impostors, string(p.UID))
			}
			if gotUID != tt.want || !slices.Equal(impostors, tt.wantImpostors) {
				t.Errorf("LinkPod() links %q, impostors %q; want %q, %q", gotUID, impostors, tt.want, tt.wantImpostors)
			}
		})
	}
}

// TestRecordedPods: the pods recorded for a VMI on this node are its own launcher, from the
// VMI's status, and the targets of migrations reaching this node that the VMI controls, found
// by recorded name and UID; a failed migration's target, a target not on this node (not made
// yet, or deleted) and a pod under the target's name with another UID are not.
func TestRecordedPods(t *testing.T) {
	const node = "node-1"
	vmiController := func(name string, uid types.UID) []metav1.OwnerReference {
		return []metav1.OwnerReference{*metav1.NewControllerRef(&v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Name: name, UID: uid}},
			v1alpha1.SchemeGroupVersion.WithKind("VirtualMachineInstance"))}
	}
	here := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: "tenant", Name: "here", UID: "uid-here"},
		Status: v1alpha1.VirtualMachineInstanceStatus{NodeName: node, LauncherPod: &v1alpha1.LauncherPodRef{Name: "launcher-here-a", UID: "pod-here"}}}
	incoming := func(name, vmi, pod string, podUID types.UID, phase v1alpha1.VirtualMachineInstanceMigrationPhase) *v1alpha1.VirtualMachineInstanceMigration {
		return &v1alpha1.VirtualMachineInstanceMigration{ObjectMeta: metav1.ObjectMeta{Namespace: "tenant", Name: name, UID: types.UID("uid-" + name)},
			Spec:   v1alpha1.VirtualMachineInstanceMigrationSpec{VMIName: vmi},
			Status: v1alpha1.VirtualMachineInstanceMigrationStatus{Phase: phase, SourceNode: "node-2", TargetNode: node, TargetPod: pod, TargetPodUID: podUID}}
	}
	pod := func(name string, uid types.UID, owner []metav1.OwnerReference) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "tenant", Name: name, UID: uid, OwnerReferences: owner}, Spec: corev1.PodSpec{NodeName: node}}
	}
	a := newPodsAgent(t, node,
		[]runtime.Object{here,
			incoming("arriving", "arriving", "launcher-arriving-t", "pod-arriving", v1alpha1.MigrationPreparingTarget),
			incoming("failed", "failed", "launcher-failed-t", "pod-failed", v1alpha1.MigrationFailed),
			incoming("gone", "gone", "launcher-gone-t", "pod-gone", v1alpha1.MigrationRunning),
			incoming("remade", "remade", "launcher-remade-t", "pod-remade", v1alpha1.MigrationRunning)},
		pod("launcher-here-a", "pod-here", vmiController("here", "uid-here")),
		pod("launcher-arriving-t", "pod-arriving", vmiController("arriving", "uid-arriving")),
		pod("launcher-failed-t", "pod-failed", vmiController("failed", "uid-failed")),
		pod("launcher-remade-t", "pod-other", vmiController("remade", "uid-remade")))
	for _, tt := range []struct {
		vmiUID string
		want   []RecordedPod
	}{
		{"uid-here", []RecordedPod{{Namespace: "tenant", Name: "launcher-here-a", UID: "pod-here"}}},
		{"uid-arriving", []RecordedPod{{Namespace: "tenant", Name: "launcher-arriving-t", UID: "pod-arriving"}}},
		{"uid-failed", nil},
		{"uid-gone", nil},
		{"uid-remade", nil},
	} {
		if got := a.recordedPods(tt.vmiUID); !slices.Equal(got, tt.want) {
			t.Errorf("recordedPods(%s) = %+v, want %+v", tt.vmiUID, got, tt.want)
		}
	}
}

// newPodsAgent is an agent on node whose informers hold objects and, for its pod informer, pods.
func newPodsAgent(t *testing.T, node string, objects []runtime.Object, pods ...*corev1.Pod) *Agent {
	t.Helper()
	client := lifeboatfake.NewSimpleClientset(objects...)
	informers := lifeboatinformers.NewSharedInformerFactory(client, 0)
	var kubeObjects []runtime.Object
	for _, p := range pods {
		kubeObjects = append(kubeObjects, p)
	}
	podInformer := coreinformers.NewPodInformer(kubefake.NewSimpleClientset(kubeObjects...), metav1.NamespaceAll, 0, cache.Indexers{})
	a, err := New(Config{NodeName: node, Recorder: record.NewFakeRecorder(10), Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Configs: informers.Lifeboat().V1alpha1().LifeboatConfigs().Lister(), PodInformer: podInformer},
		client, informers.Lifeboat().V1alpha1().VirtualMachineInstances(), informers.Lifeboat().V1alpha1().LifeboatConfigs(),
		[]lifeboatv1alpha1informers.VirtualMachineInstanceMigrationInformer{informers.Lifeboat().V1alpha1().VirtualMachineInstanceMigrations()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	informers.Start(ctx.Done())
	go podInformer.Run(ctx.Done())
	informers.WaitForCacheSync(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), podInformer.HasSynced) {
		t.Fatal("caches did not sync")
	}
	return a
}

// TestARunVolumeMadeAfterItsPodArrivedIsLinkedAtOnce: the kubelet makes a pod's run volume after
// the pod reached the node, and no pod event marks it; the agent links it within a second, not at
// its next resync (an hour here), so that the launcher finds its notify socket as it starts.
func TestARunVolumeMadeAfterItsPodArrivedIsLinkedAtOnce(t *testing.T) {
	const node = "node-1"
	vmi := &v1alpha1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Namespace: "tenant", Name: "vm", UID: "uid-vm"},
		Status: v1alpha1.VirtualMachineInstanceStatus{NodeName: node, LauncherPod: &v1alpha1.LauncherPodRef{Name: "launcher-vm", UID: "pod-vm"}}}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "tenant", Name: "launcher-vm", UID: "pod-vm",
		OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(vmi, v1alpha1.SchemeGroupVersion.WithKind("VirtualMachineInstance"))}},
		Spec: corev1.PodSpec{NodeName: node}}
	a := newPodsAgent(t, node, []runtime.Object{vmi}, pod)
	root := t.TempDir()
	a.cfg.KubeletPodsDir, a.cfg.DomainsDir = filepath.Join(root, "pods"), filepath.Join(root, "domains")
	if err := os.MkdirAll(a.cfg.DomainsDir, 0o755); err != nil {
		t.Fatal(err)
	}
	dirs := &podDirs{a: a, notify: map[string]*notifyServing{}, impostors: map[types.UID]bool{}, volumeWaits: map[string]*volumeWait{}}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go dirs.run(ctx, time.Hour)

	link := filepath.Join(a.cfg.DomainsDir, string(vmi.UID))
	// The pod is there and its volume is not: nothing to link yet.
	if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		dirs.mu.Lock()
		defer dirs.mu.Unlock()
		return dirs.volumeWaits[string(vmi.UID)] != nil, nil
	}); err != nil {
		t.Fatalf("the agent never looked for the pod's run volume: %v", err)
	}
	if _, err := os.Lstat(link); !os.IsNotExist(err) {
		t.Fatalf("%s exists before the pod's run volume does: %v", link, err)
	}
	volume := dirs.runVolume(string(pod.UID))
	if err := os.MkdirAll(volume, 0o755); err != nil {
		t.Fatal(err)
	}
	made := time.Now()
	var linkedTo string
	if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		linkedTo, _ = os.Readlink(link)
		return linkedTo == volume, nil
	}); err != nil {
		t.Fatalf("the VM's directory %s links to %q 5 s after the pod's run volume was made, want %s", link, linkedTo, volume)
	}
	t.Logf("linked %s after the volume was made", time.Since(made).Round(time.Millisecond))
	dirs.mu.Lock()
	defer dirs.mu.Unlock()
	if w := dirs.volumeWaits[string(vmi.UID)]; w != nil {
		t.Errorf("the agent still looks for a volume it linked: %+v", w)
	}
}
