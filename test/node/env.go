package node

import (
	"errors"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// defaultPath is the PATH container runtimes give a container whose image sets none.
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// containerEnv is the environment of c as "NAME=value" entries: what the runtime provides
// (PATH, HOSTNAME, HOME), then the container's env in order, each value expanded against the
// variables before it and downward-API fields resolved, as the kubelet's
// makeEnvironmentVariables does. status.podIP is podIP: the node's address for pods on the
// host's network.
func containerEnv(pod *corev1.Pod, c *corev1.Container, hostIP, podIP string) ([]string, error) {
	if len(c.EnvFrom) > 0 {
		return nil, errors.New("envFrom is not supported by the emulated node")
	}
	names := []string{"PATH", "HOSTNAME", "HOME"}
	values := map[string]string{"PATH": defaultPath, "HOSTNAME": pod.Name, "HOME": "/root"}
	for _, e := range c.Env {
		value := expand(e.Value, func(name string) (string, bool) {
			v, ok := values[name]
			return v, ok
		})
		if e.ValueFrom != nil {
			v, err := envSourceValue(pod, e.ValueFrom, hostIP, podIP)
			if err != nil {
				return nil, fmt.Errorf("env %s: %w", e.Name, err)
			}
			value = v
		}
		if _, ok := values[e.Name]; !ok {
			names = append(names, e.Name)
		}
		values[e.Name] = value
	}
	env := make([]string, 0, len(names))
	for _, name := range names {
		env = append(env, name+"="+values[name])
	}
	return env, nil
}

func envSourceValue(pod *corev1.Pod, from *corev1.EnvVarSource, hostIP, podIP string) (string, error) {
	if from.FieldRef == nil {
		return "", errors.New("only fieldRef values are supported by the emulated node")
	}
	switch from.FieldRef.FieldPath {
	case "metadata.name":
		return pod.Name, nil
	case "metadata.namespace":
		return pod.Namespace, nil
	case "metadata.uid":
		return string(pod.UID), nil
	case "spec.nodeName":
		return pod.Spec.NodeName, nil
	case "spec.serviceAccountName":
		return pod.Spec.ServiceAccountName, nil
	case "status.hostIP":
		return hostIP, nil
	case "status.podIP":
		return podIP, nil
	default:
		return "", fmt.Errorf("fieldRef %q is not supported by the emulated node", from.FieldRef.FieldPath)
	}
}

// envLookup turns "NAME=value" entries into a lookup for expand.
func envLookup(env []string) func(string) (string, bool) {
	values := make(map[string]string, len(env))
	for _, e := range env {
		if name, value, ok := strings.Cut(e, "="); ok {
			values[name] = value
		}
	}
	return func(name string) (string, bool) {
		v, ok := values[name]
		return v, ok
	}
}
