// Package identity checks, as lifeboat's controller and agent start, that they run as the service
// accounts lifeboat's admission policies name. The policies (manifests/) hold each component to
// what it may write by matching its username, a literal: installed into another namespace (a
// kustomize namespace: override) or with a renamed service account, every node restriction and
// the controller's pod limits would silently stop applying (issue 45, N14). A component that
// finds itself another service account refuses to start, saying so.
package identity

import (
	"context"
	"fmt"
	"strings"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// The usernames the policies in manifests/ name (test/manifests checks that they name no other).
const (
	Controller = "system:serviceaccount:lifeboat-system:lifeboat-controller"
	Agent      = "system:serviceaccount:lifeboat-system:lifeboat-agent"
)

const serviceAccountPrefix = "system:serviceaccount:"

// Check asks the API server who kube's credentials are (a SelfSubjectReview, which every
// authenticated user may make) and refuses a service account other than want. Other users (an
// admin's credentials, as test clusters give an agent run outside a pod) pass: they are not what
// an installation from manifests/ runs as. want "" turns the check off, for policies rewritten
// to name other accounts.
func Check(ctx context.Context, kube kubernetes.Interface, want string) error {
	if want == "" {
		return nil
	}
	review, err := kube.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("asking the API server which user this is, to check that lifeboat's admission policies apply to it: %w", err)
	}
	return decide(review.Status.UserInfo.Username, want)
}

func decide(username, want string) error {
	if username == want || !strings.HasPrefix(username, serviceAccountPrefix) {
		return nil
	}
	return fmt.Errorf("running as %s, but lifeboat's admission policies (manifests/) hold %s: they would not apply to this one. "+
		"Install lifeboat in namespace lifeboat-system with its own service accounts (kubectl apply --server-side -k manifests/), "+
		"or, having rewritten every policy for this account, start it with --policy-user=%s", username, want, username)
}
