package serve

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"log/slog"
	"net/http"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/cache"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/cert"
)

// decisionTTL is how long an answer of the API server is reused for the same token and path, as
// the Kubernetes components' delegating authenticator and authorizer cache theirs: a scrape every
// few seconds costs the API server a review every decisionTTL, not one per scrape.
const decisionTTL = 10 * time.Second

// maxReviews bounds the reviews in flight: a flood of made-up tokens must not take the client's
// share of the API server (and its rate limiter) from the controllers that share it.
const maxReviews = 4

// Authorized serves next only to callers the API server knows: a bearer token that a TokenReview
// authenticates (401 otherwise), whose user a SubjectAccessReview allows to get the request's
// path as a non-resource URL (403 otherwise), as the Kubernetes components protect /metrics. A
// cluster admin grants it with a ClusterRole rule such as nonResourceURLs [/metrics], verbs [get].
func Authorized(next http.Handler, kube kubernetes.Interface, log *slog.Logger) http.Handler {
	decisions := cache.NewLRUExpireCache(1024)
	reviews := make(chan struct{}, maxReviews)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || token == "" {
			http.Error(w, "Unauthorized: a bearer token the API server authenticates is required", http.StatusUnauthorized)
			return
		}
		key := sha256.Sum256([]byte(r.URL.Path + "\x00" + token))
		code, cached := decisions.Get(key)
		if !cached {
			select {
			case reviews <- struct{}{}:
			default:
				http.Error(w, "Too many callers are being reviewed; try again", http.StatusTooManyRequests)
				return
			}
			code = decide(r.Context(), kube, token, r.URL.Path, log)
			<-reviews
			if code != http.StatusServiceUnavailable {
				decisions.Add(key, code, decisionTTL)
			}
		}
		switch code {
		case http.StatusOK:
			next.ServeHTTP(w, r)
		case http.StatusUnauthorized:
			http.Error(w, "Unauthorized: the API server does not authenticate this token", http.StatusUnauthorized)
		case http.StatusForbidden:
			http.Error(w, "Forbidden: get "+r.URL.Path+" is not allowed for this user", http.StatusForbidden)
		default:
			http.Error(w, "the API server could not be asked who the caller is", http.StatusServiceUnavailable)
		}
	})
}

// decide asks the API server who holds token and whether they may get path: an HTTP status.
func decide(ctx context.Context, kube kubernetes.Interface, token, path string, log *slog.Logger) int {
	review, err := kube.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{
		Spec: authenticationv1.TokenReviewSpec{Token: token}}, metav1.CreateOptions{})
	if err != nil {
		log.Error("reviewing a metrics caller's token", "err", err)
		return http.StatusServiceUnavailable
	}
	if !review.Status.Authenticated {
		return http.StatusUnauthorized
	}
	u := review.Status.User
	extra := map[string]authorizationv1.ExtraValue{}
	for k, v := range u.Extra {
		extra[k] = authorizationv1.ExtraValue(v)
	}
	sar, err := kube.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
		Spec: authorizationv1.SubjectAccessReviewSpec{User: u.Username, UID: u.UID, Groups: u.Groups, Extra: extra,
			NonResourceAttributes: &authorizationv1.NonResourceAttributes{Path: path, Verb: "get"}}}, metav1.CreateOptions{})
	if err != nil {
		log.Error("asking whether a metrics caller may read them", "user", u.Username, "err", err)
		return http.StatusServiceUnavailable
	}
	if !sar.Status.Allowed {
		log.Info("refused a metrics caller", "user", u.Username, "path", path, "reason", sar.Status.Reason)
		return http.StatusForbidden
	}
	return http.StatusOK
}

// SelfSignedTLS is a TLS configuration with a certificate made for this process's lifetime, as a
// Kubernetes component serves its secure port when it is given none: it keeps tokens off the
// wire; scrapers that do not pin it skip its verification.
func SelfSignedTLS(host string) (*tls.Config, error) {
	certPEM, keyPEM, err := cert.GenerateSelfSignedCertKey(host, nil, nil)
	if err != nil {
		return nil, err
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, err
	}
	return &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}, nil
}
