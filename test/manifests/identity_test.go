package manifests

import (
	"context"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/lifeboat-vm/lifeboat/api/identity"
)

// The admission policies in manifests/ hold lifeboat's components by literal usernames: every one
// they name is a service account manifests/ makes, and one its workloads run as, and each is the
// username the component checks itself against as it starts (identity.Controller, identity.Agent).
func TestThePoliciesNameLifeboatsOwnServiceAccounts(t *testing.T) {
	objs := install(t)
	accounts := map[string]bool{} // the usernames of the service accounts manifests/ makes and its workloads run as
	made := map[string]bool{}
	for _, o := range objs {
		if o.GetKind() == "ServiceAccount" {
			made[o.GetNamespace()+"/"+o.GetName()] = true
		}
	}
	for _, o := range objs {
		if o.GetKind() != "Deployment" && o.GetKind() != "DaemonSet" {
			continue
		}
		spec := o.Object["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)
		sa, _ := spec["serviceAccountName"].(string)
		if sa == "" {
			// A workload that never calls the API (the QEMU probe) carries no token at all.
			if automount, ok := spec["automountServiceAccountToken"].(bool); !ok || automount {
				t.Errorf("%s names no service account and still mounts the default one's token", key(o))
			}
			continue
		}
		if !made[o.GetNamespace()+"/"+sa] {
			t.Errorf("%s runs as service account %s/%s, which manifests/ does not make", key(o), o.GetNamespace(), sa)
		}
		accounts["system:serviceaccount:"+o.GetNamespace()+":"+sa] = true
	}
	for _, want := range []string{identity.Controller, identity.Agent} {
		if !accounts[want] {
			t.Errorf("no workload in manifests/ runs as %s, the user the components check themselves against (have %v)", want, accounts)
		}
	}
	username := regexp.MustCompile(`system:serviceaccount:[a-z0-9.-]+:[a-z0-9.-]+`)
	named := 0
	for _, o := range objs {
		if o.GetKind() != "ValidatingAdmissionPolicy" {
			continue
		}
		data, err := o.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		for _, u := range username.FindAllString(string(data), -1) {
			named++
			if !slices.Contains([]string{identity.Controller, identity.Agent}, u) {
				t.Errorf("%s names %s, which is neither %s nor %s", key(o), u, identity.Controller, identity.Agent)
			}
		}
	}
	if named == 0 {
		t.Error("no policy in manifests/ names a service account: the check above checks nothing")
	}
}

// TestAControllerThePoliciesDoNotNameRefusesToStart: lifeboat's controller run as a service
// account the policies do not name, as a renamed account or an install into another namespace
// would make it, exits at once saying why, instead of running without its limits.
func TestAControllerThePoliciesDoNotNameRefusesToStart(t *testing.T) {
	install(t)
	const renamed = "lifeboat-controller-renamed"
	ctx := t.Context()
	if _, err := cluster.Kube.CoreV1().ServiceAccounts("lifeboat-system").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: renamed}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cluster.Kube.CoreV1().ServiceAccounts("lifeboat-system").Delete(context.Background(), renamed, metav1.DeleteOptions{})
	})
	p := startReplica(t, serviceAccountKubeconfig(t, renamed), "renamed")
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		t.Fatal("the controller runs as a service account the policies do not name")
	}
	const says = "running as system:serviceaccount:lifeboat-system:" + renamed + ", but lifeboat's admission policies (manifests/) hold " + identity.Controller
	if log := p.logText(); !strings.Contains(log, says) {
		t.Errorf("the controller's log:\n%s\nwant it to say %q", log, says)
	}
	if code := p.cmd.ProcessState.ExitCode(); code != 1 {
		t.Errorf("the controller exited with %d, want 1", code)
	}
}
