package node

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// apiVolumes prepares the volumes whose source the node reads from the API server, as the
// kubelet's volume manager does. A persistentVolumeClaim volume is the directory of its bound
// PersistentVolume: a hostPath or local PersistentVolume is a directory of this machine (a
// hostPath under a node's private prefixes is that node's own); other sources are not supported.
// A Secret volume is the Secret's keys written as files in the pod's directory.
type apiVolumes struct {
	client kubernetes.Interface
	l      *layout

	mu    sync.Mutex
	paths map[string]string // pod UID/volume → directory
}

func claimKey(uid types.UID, volume string) string { return string(uid) + "/" + volume }

// apiTimeout bounds the API calls of one volume's preparation.
const apiTimeout = 10 * time.Second

// resolve finds the directory of the claim of pod's volume v and remembers it for known.
func (c *apiVolumes) resolve(pod *corev1.Pod, v *corev1.Volume) error {
	if c == nil || c.client == nil {
		return fmt.Errorf("persistentVolumeClaim %q: this node has no API client to find it", v.PersistentVolumeClaim.ClaimName)
	}
	ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
	defer cancel()
	name := v.PersistentVolumeClaim.ClaimName
	claim, err := c.client.CoreV1().PersistentVolumeClaims(pod.Namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("persistentVolumeClaim %q: %w", name, err)
	}
	if claim.Spec.VolumeName == "" {
		return fmt.Errorf("persistentVolumeClaim %q is not bound to a volume yet", name)
	}
	pv, err := c.client.CoreV1().PersistentVolumes().Get(ctx, claim.Spec.VolumeName, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("persistentVolume %q of claim %q: %w", claim.Spec.VolumeName, name, err)
	}
	var dir string
	switch {
	case pv.Spec.HostPath != nil:
		dir = c.l.hostPath(pv.Spec.HostPath.Path)
	case pv.Spec.Local != nil:
		dir = pv.Spec.Local.Path
	default:
		return fmt.Errorf("persistentVolume %q: only hostPath and local volumes can be mounted on this node", pv.Name)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.paths == nil {
		c.paths = map[string]string{}
	}
	c.paths[claimKey(pod.UID, v.Name)] = dir
	return nil
}

// known is the directory resolve found for pod's volume, or "".
func (c *apiVolumes) known(pod *corev1.Pod, volume string) string {
	if c == nil {
		return ""
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.paths[claimKey(pod.UID, volume)]
}

// writeSecret writes the keys of the Secret of pod's volume v as files into dir.
func (c *apiVolumes) writeSecret(pod *corev1.Pod, v *corev1.Volume, dir string) error {
	if c == nil || c.client == nil {
		return fmt.Errorf("secret %q: this node has no API client to read it", v.Secret.SecretName)
	}
	ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
	defer cancel()
	secret, err := c.client.CoreV1().Secrets(pod.Namespace).Get(ctx, v.Secret.SecretName, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("secret %q: %w", v.Secret.SecretName, err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	// As the kubelet writes them: defaultMode (0644 unless set), the pod's fsGroup as group.
	mode := os.FileMode(corev1.SecretVolumeSourceDefaultMode)
	if v.Secret.DefaultMode != nil {
		mode = os.FileMode(*v.Secret.DefaultMode)
	}
	gid := -1
	if sc := pod.Spec.SecurityContext; sc != nil && sc.FSGroup != nil {
		gid = int(*sc.FSGroup)
	}
	for key, data := range secret.Data {
		path := filepath.Join(dir, filepath.Base(key))
		if err := os.WriteFile(path, data, mode); err != nil {
			return err
		}
		if err := os.Chmod(path, mode); err != nil {
			return err
		}
		if err := os.Lchown(path, -1, gid); err != nil {
			return err
		}
	}
	return nil
}
