package atrisk

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	kubefake "k8s.io/client-go/kubernetes/fake"

	lifeboatfake "github.com/lifeboat-vm/lifeboat/api/client/clientset/versioned/fake"
	lifeboatinformers "github.com/lifeboat-vm/lifeboat/api/client/informers/externalversions"
	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

func TestCondition(t *testing.T) {
	atRisk := v1alpha1.NodeEvictionExposure{AtRisk: true, Message: "the kubelet's hard threshold acts first"}
	safe := v1alpha1.NodeEvictionExposure{Relief: true}
	for _, tc := range []struct {
		name         string
		exposures    map[string]v1alpha1.NodeEvictionExposure
		want         metav1.ConditionStatus
		wantInMsg    []string
		wantNotInMsg []string
	}{
		{"no node reported", nil, metav1.ConditionFalse, []string{"0 nodes"}, nil},
		{"every node safe", map[string]v1alpha1.NodeEvictionExposure{"a": safe, "b": safe}, metav1.ConditionFalse, []string{"2 nodes"}, nil},
		{"one node at risk: named, with its reason", map[string]v1alpha1.NodeEvictionExposure{"a": safe, "b": atRisk}, metav1.ConditionTrue,
			[]string{"1 node(s)", ": b.", "On b: the kubelet's hard threshold acts first"}, []string{"a,"}},
		{"many nodes at risk: the first ten named, the rest counted", func() map[string]v1alpha1.NodeEvictionExposure {
			m := map[string]v1alpha1.NodeEvictionExposure{}
			for _, n := range []string{"n00", "n01", "n02", "n03", "n04", "n05", "n06", "n07", "n08", "n09", "n10", "n11"} {
				m[n] = atRisk
			}
			return m
		}(), metav1.ConditionTrue, []string{"12 node(s)", "n00, n01", "n09 and 2 more"}, []string{"n10"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Condition(tc.exposures)
			if c.Type != v1alpha1.ConfigConditionVMsAtRisk || c.Status != tc.want {
				t.Errorf("condition %s=%s, want %s=%s", c.Type, c.Status, v1alpha1.ConfigConditionVMsAtRisk, tc.want)
			}
			for _, s := range tc.wantInMsg {
				if !strings.Contains(c.Message, s) {
					t.Errorf("message %q lacks %q", c.Message, s)
				}
			}
			for _, s := range tc.wantNotInMsg {
				if strings.Contains(c.Message, s) {
					t.Errorf("message %q has %q", c.Message, s)
				}
			}
		})
	}
}

// TestSyncWritesTheConditionFromTheNodesAnnotations: the controller gathers the agents' node
// annotations into the LifeboatConfig's status, and writes nothing when that is already there.
func TestSyncWritesTheConditionFromTheNodesAnnotations(t *testing.T) {
	node := func(name string, atRisk bool) *corev1.Node {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
		if atRisk {
			n.Annotations = map[string]string{v1alpha1.AnnotationEvictionExposure: `{"source":"defaults","atRisk":true,"message":"too short"}`}
		} else {
			n.Annotations = map[string]string{v1alpha1.AnnotationEvictionExposure: `{"source":"configz","atRisk":false,"message":"fits"}`}
		}
		return n
	}
	kube := kubefake.NewClientset(node("a", true), node("b", false), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "no-agent"}})
	lb := lifeboatfake.NewSimpleClientset(&v1alpha1.LifeboatConfig{ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.ConfigName}})
	kubeInformers := informers.NewSharedInformerFactory(kube, 0)
	lbInformers := lifeboatinformers.NewSharedInformerFactory(lb, 0)
	c := New(lb, kubeInformers.Core().V1().Nodes().Informer(), lbInformers.Lifeboat().V1alpha1().LifeboatConfigs(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kubeInformers.Start(ctx.Done())
	lbInformers.Start(ctx.Done())
	kubeInformers.WaitForCacheSync(ctx.Done())
	lbInformers.WaitForCacheSync(ctx.Done())

	if err := c.sync(ctx); err != nil {
		t.Fatal(err)
	}
	config, err := lb.LifeboatV1alpha1().LifeboatConfigs().Get(ctx, v1alpha1.ConfigName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cond := meta.FindStatusCondition(config.Status.Conditions, v1alpha1.ConfigConditionVMsAtRisk)
	if cond == nil || cond.Status != metav1.ConditionTrue || !strings.Contains(cond.Message, "1 node(s)") || !strings.Contains(cond.Message, "On a: too short") {
		t.Fatalf("condition %+v: want True naming node a with its reason", cond)
	}
}
