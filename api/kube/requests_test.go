package kube

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestRequestKind(t *testing.T) {
	cases := []struct {
		method, url    string
		verb, resource string
	}{
		{"GET", "/api/v1/nodes/n1", "get", "nodes"},
		{"GET", "/api/v1/nodes", "list", "nodes"},
		{"GET", "/api/v1/pods?watch=true&resourceVersion=5", "watch", "pods"},
		{"GET", "/api/v1/namespaces/ns/pods?labelSelector=a%3Db", "list", "pods"},
		{"POST", "/api/v1/namespaces/ns/pods", "create", "pods"},
		{"PATCH", "/api/v1/namespaces/ns/pods/p", "patch", "pods"},
		{"PUT", "/api/v1/namespaces/ns/pods/p/status", "update", "pods/status"},
		{"POST", "/api/v1/namespaces/ns/pods/p/eviction", "create", "pods/eviction"},
		{"DELETE", "/api/v1/namespaces/ns/pods/p", "delete", "pods"},
		{"DELETE", "/api/v1/namespaces/ns/pods", "deletecollection", "pods"},
		{"GET", "/api/v1/namespaces/ns", "get", "namespaces"},
		{"GET", "/api/v1/namespaces", "list", "namespaces"},
		{"PUT", "/apis/lifeboat.dev/v1alpha1/namespaces/ns/virtualmachineinstances/vm/status", "update", "virtualmachineinstances/status"},
		{"POST", "/apis/lifeboat.dev/v1alpha1/namespaces/ns/virtualmachineinstancemigrations", "create", "virtualmachineinstancemigrations"},
		{"GET", "/apis/lifeboat.dev/v1alpha1/lifeboatconfigs?watch=1", "watch", "lifeboatconfigs"},
		{"PUT", "/apis/coordination.k8s.io/v1/namespaces/lifeboat-system/leases/lifeboat-controller", "update", "leases"},
		{"GET", "/apis/lifeboat.dev/v1alpha1", "get", ""},
		{"GET", "/healthz", "get", ""},
	}
	for _, tc := range cases {
		verb, resource := RequestKind(httptest.NewRequest(tc.method, tc.url, nil))
		if verb != tc.verb || resource != tc.resource {
			t.Errorf("%s %s: (%s, %s), want (%s, %s)", tc.method, tc.url, verb, resource, tc.verb, tc.resource)
		}
	}
}

func TestClientsCountTheirRequests(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"kind":"NodeList","apiVersion":"v1","items":[]}`))
	}))
	defer srv.Close()
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	config := fmt.Sprintf("apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: %q}}]\nusers: [{name: u, user: {}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n", srv.URL)
	if err := os.WriteFile(kubeconfig, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	kube, _, err := Clients(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	lists := RequestsMetric.WithLabelValues("list", "nodes")
	before := testutil.ToFloat64(lists)
	if _, err := kube.CoreV1().Nodes().List(t.Context(), metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(lists) - before; got != 1 {
		t.Errorf("a node list counted %v times, want once", got)
	}
}
