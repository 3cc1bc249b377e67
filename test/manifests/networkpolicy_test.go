package manifests

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/lifeboat-vm/lifeboat/test/controlplane"
)

// podCIDROverlay sets the pod network's CIDR, as docs/operations.md shows.
const podCIDROverlay = `apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
- %s
patches:
- target: {kind: NetworkPolicy, name: lifeboat-controller}
  patch: |-
    - {op: replace, path: /spec/ingress/0/from/0/ipBlock/except/0, value: 10.42.0.0/16}
`

// TestTheWebhookPortAdmitsOnlyCallersOutsideThePodNetwork: the controller's NetworkPolicy admits
// the webhook's port from every address but the pod network's (10.244.0.0/16 unless an overlay
// sets the cluster's) and from the API server's konnectivity agents, the metrics port from
// anywhere, nothing else.
func TestTheWebhookPortAdmitsOnlyCallersOutsideThePodNetwork(t *testing.T) {
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	// kustomize takes a base only by a relative path.
	base, err := filepath.Rel(dir, filepath.Join(root, "manifests"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), fmt.Appendf(nil, podCIDROverlay, base), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, dir, podCIDR string }{
		{"the default", filepath.Join(root, "manifests"), "10.244.0.0/16"},
		{"an overlay's", dir, "10.42.0.0/16"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := cluster.Kubectl(t.Context(), "kustomize", tc.dir)
			if err != nil {
				t.Fatalf("kubectl kustomize: %v\n%s", err, out)
			}
			objs, err := decode([]byte(out))
			if err != nil {
				t.Fatal(err)
			}
			var policy *networkingv1.NetworkPolicy
			for _, o := range objs {
				if key(o) == "NetworkPolicy lifeboat-system/lifeboat-controller" {
					policy = &networkingv1.NetworkPolicy{}
					if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, policy); err != nil {
						t.Fatal(err)
					}
				}
			}
			if policy == nil {
				t.Fatal("no NetworkPolicy lifeboat-system/lifeboat-controller")
			}
			if got := policy.Spec.PodSelector.MatchLabels["app.kubernetes.io/name"]; got != "lifeboat-controller" || !slices.Equal(policy.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}) {
				t.Errorf("want an Ingress policy of the controller's pods: %+v", policy.Spec)
			}
			rules := map[string]networkingv1.NetworkPolicyIngressRule{}
			for _, r := range policy.Spec.Ingress {
				if len(r.Ports) != 1 || r.Ports[0].Port == nil {
					t.Fatalf("want one named port per rule: %+v", r)
				}
				rules[r.Ports[0].Port.String()] = r
			}
			if len(rules) != 2 {
				t.Fatalf("want rules for the ports webhook and metrics only: %+v", policy.Spec.Ingress)
			}
			if len(rules["metrics"].From) != 0 {
				t.Errorf("metrics are open to every caller the API server authorizes: %+v", rules["metrics"].From)
			}
			from := rules["webhook"].From
			if len(from) != 2 || from[0].IPBlock == nil || from[0].IPBlock.CIDR != "0.0.0.0/0" || !slices.Equal(from[0].IPBlock.Except, []string{tc.podCIDR}) {
				t.Fatalf("the webhook's port: want every address but %s first: %+v", tc.podCIDR, from)
			}
			if k := from[1]; k.IPBlock != nil || k.NamespaceSelector == nil || k.PodSelector == nil || k.NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"] != "kube-system" || k.PodSelector.MatchLabels["k8s-app"] != "konnectivity-agent" {
				t.Errorf("the webhook's port: want kube-system's konnectivity agents second: %+v", k)
			}
		})
	}
}
