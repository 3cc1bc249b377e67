package node

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/yaml"

	contract "github.com/lifeboat-vm/lifeboat/api/launcher"
)

// StartQEMUProbe installs lifeboat's QEMU probe (manifest, a path to manifests/qemu-probe.yaml:
// its PriorityClass and DaemonSet) unless it is, and returns once the DaemonSet's pod on n has
// written its capabilities file, which n's agent gives each new launcher. The cluster runs
// kube-controller-manager, whose DaemonSet controller makes the pod (so that kubectl drain
// knows it for a DaemonSet's).
func (n *Node) StartQEMUProbe(ctx context.Context, manifest string) error {
	b, err := os.ReadFile(manifest)
	if err != nil {
		return err
	}
	client := n.cfg.Client
	var ds appsv1.DaemonSet
	for _, doc := range strings.Split(string(b), "\n---\n") {
		var kind metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &kind); err != nil {
			return fmt.Errorf("reading %s: %w", manifest, err)
		}
		switch kind.Kind {
		case "DaemonSet":
			err = yaml.UnmarshalStrict([]byte(doc), &ds)
		case "PriorityClass":
			var pc schedulingv1.PriorityClass
			if err = yaml.UnmarshalStrict([]byte(doc), &pc); err == nil {
				if _, err = client.SchedulingV1().PriorityClasses().Create(ctx, &pc, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
					err = nil
				}
			}
		default:
			err = fmt.Errorf("unexpected %s", kind.Kind)
		}
		if err != nil {
			return fmt.Errorf("%s in %s: %w", kind.Kind, manifest, err)
		}
	}
	if _, err := client.AppsV1().DaemonSets(ds.Namespace).Create(ctx, &ds, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating the DaemonSet %s: %w", ds.Name, err)
	}
	var last []corev1.Pod
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		pods, err := client.CoreV1().Pods(ds.Namespace).List(ctx, metav1.ListOptions{
			LabelSelector: labels.SelectorFromSet(ds.Spec.Selector.MatchLabels).String(), FieldSelector: "spec.nodeName=" + n.Name()})
		if err != nil {
			return false, nil
		}
		last = pods.Items
		for _, p := range pods.Items {
			file := filepath.Join(n.HostPath("/var/lib/kubelet/pods"), string(p.UID), "volumes", "kubernetes.io~empty-dir", contract.QEMUProbeVolume, contract.QEMUProbeFile)
			if _, err := os.Stat(file); err == nil {
				return true, nil
			}
		}
		return false, nil
	}); err != nil {
		var logs []string
		for _, p := range last {
			log, _ := n.ContainerLog(&p, ds.Spec.Template.Spec.Containers[0].Name)
			logs = append(logs, p.Name+": "+log)
		}
		return fmt.Errorf("no QEMU probe pod on %s wrote its capabilities within 2m: %w\n%s", n.Name(), err, strings.Join(logs, "\n"))
	}
	return nil
}
