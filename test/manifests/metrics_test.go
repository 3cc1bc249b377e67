package manifests

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
)

// TestTheControllersMetricsAnswerOnlyCallersAllowedToReadThem: the controller, run as its service
// account with the manifests' RBAC and its default metrics flags, serves /metrics over TLS; a
// caller without a token is told 401, a token the API server does not know 401, a service account
// the cluster admin has not granted lifeboat-metrics-reader 403, and one bound to it gets the
// metrics. Plain, unauthenticated metrics are refused on anything but loopback.
func TestTheControllersMetricsAnswerOnlyCallersAllowedToReadThem(t *testing.T) {
	install(t)
	ctx := context.Background()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	address := l.Addr().String()
	l.Close()
	ctrl := startReplica(t, serviceAccountKubeconfig(t, controllerSA), "metrics", "--metrics-listen", address)

	ns := "lifeboat-system"
	token := func(sa string) string {
		if _, err := cluster.Kube.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cluster.Kube.CoreV1().ServiceAccounts(ns).Delete(context.Background(), sa, metav1.DeleteOptions{})
		})
		tr, err := cluster.Kube.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa,
			&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return tr.Status.Token
	}
	stranger, scraper := token("metrics-stranger"), token("metrics-scraper")
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "metrics-scraper"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "lifeboat-metrics-reader"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "metrics-scraper", Namespace: ns}}}
	if _, err := cluster.Kube.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cluster.Kube.RbacV1().ClusterRoleBindings().Delete(context.Background(), binding.Name, metav1.DeleteOptions{})
	})

	// The certificate is the controller's own, made at its start: a scraper that does not pin it
	// skips its verification, as for the Kubernetes components' secure ports.
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	get := func(bearer string) (int, string, error) {
		req, err := http.NewRequest(http.MethodGet, "https://"+address+"/metrics", nil)
		if err != nil {
			return 0, "", err
		}
		if bearer != "" {
			req.Header.Set("Authorization", "Bearer "+bearer)
		}
		resp, err := client.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body), err
	}
	var last string
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		code, body, err := get(scraper)
		last = fmt.Sprintf("%d %v %.200s", code, err, body)
		return code == http.StatusOK && strings.Contains(body, "go_goroutines"), nil
	}); err != nil {
		t.Fatalf("a service account bound to lifeboat-metrics-reader gets no metrics within 30s: last %s\n%s", last, ctrl.logText())
	}
	for _, tc := range []struct {
		what, token string
		want        int
	}{
		{"no token", "", http.StatusUnauthorized},
		{"a token the API server does not know", "not-a-token", http.StatusUnauthorized},
		{"a service account without lifeboat-metrics-reader", stranger, http.StatusForbidden},
	} {
		code, body, err := get(tc.token)
		if err != nil || code != tc.want || strings.Contains(body, "go_goroutines") {
			t.Errorf("%s: %d %v %.200q; want %d and no metric", tc.what, code, err, body, tc.want)
		}
	}
	// Plain HTTP over TLS's port is not served either.
	if resp, err := (&http.Client{Timeout: 5 * time.Second}).Get("http://" + address + "/metrics"); err == nil {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(body), "go_goroutines") {
			t.Errorf("plain HTTP got metrics: %d", resp.StatusCode)
		}
	}

	refused := startReplica(t, serviceAccountKubeconfig(t, controllerSA), "metrics-insecure", "--metrics-listen", "0.0.0.0:0", "--metrics-insecure")
	select {
	case <-refused.done:
	case <-time.After(30 * time.Second):
		t.Fatal("a controller told to serve plain metrics on every address is still running after 30s")
	}
	if log := refused.logText(); !strings.Contains(log, "loopback address only") {
		t.Errorf("the refusal of plain metrics on 0.0.0.0 does not say why:\n%s", log)
	}
}
