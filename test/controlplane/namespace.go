package controlplane

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Namespace creates a namespace for one test, named prefix and a random suffix, and deletes it
// when the test ends. With the controller manager it returns once the namespace has its default
// service account, without which the API server refuses pods.
func (cp *ControlPlane) Namespace(t testing.TB, prefix string) string {
	t.Helper()
	ns, err := cp.Kube.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: prefix}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating a namespace: %v", err)
	}
	t.Cleanup(func() {
		_ = cp.Kube.CoreV1().Namespaces().Delete(context.Background(), ns.Name, metav1.DeleteOptions{})
	})
	if cp.serviceAccounts {
		if err := cp.waitDefaultServiceAccount(context.Background(), ns.Name); err != nil {
			t.Fatal(err)
		}
	}
	return ns.Name
}
