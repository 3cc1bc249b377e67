package node

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/yaml"

	contract "github.com/lifeboat-vm/lifeboat/api/launcher"
)

// StartQEMUProbe runs on n the pod of lifeboat's QEMU probe DaemonSet (manifest, a path to
// manifests/qemu-probe.yaml) as the DaemonSet's controller would create it there, and returns
// once it has written its capabilities file, which n's agent gives each new launcher.
func (n *Node) StartQEMUProbe(ctx context.Context, manifest string) error {
	b, err := os.ReadFile(manifest)
	if err != nil {
		return err
	}
	var ds appsv1.DaemonSet
	if err := yaml.UnmarshalStrict(b, &ds); err != nil {
		return fmt.Errorf("reading %s: %w", manifest, err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: ds.Name + "-" + n.Name(), Namespace: ds.Namespace, Labels: ds.Spec.Template.Labels},
		Spec:       *ds.Spec.Template.Spec.DeepCopy(),
	}
	pod.Spec.NodeName = n.Name()
	created, err := n.cfg.Client.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("creating the QEMU probe's pod on %s: %w", n.Name(), err)
	}
	file := filepath.Join(n.HostPath("/var/lib/kubelet/pods"), string(created.UID), "volumes", "kubernetes.io~empty-dir", contract.QEMUProbeVolume, contract.QEMUProbeFile)
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 2*time.Minute, true, func(context.Context) (bool, error) {
		_, err := os.Stat(file)
		return err == nil, nil
	}); err != nil {
		log, _ := n.ContainerLog(created, ds.Spec.Template.Spec.Containers[0].Name)
		return fmt.Errorf("the QEMU probe on %s wrote no %s within 2m: %w\n%s", n.Name(), file, err, log)
	}
	return nil
}
