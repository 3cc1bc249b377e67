package node

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"log"
	"math/big"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/klog/v2"
)

const (
	// clientCAConfigMap is where the API server publishes the CA of the client certificates it
	// accepts (--client-ca-file), for servers that authenticate callers as it does.
	clientCAConfigMap    = "extension-apiserver-authentication"
	clientCAConfigMapKey = "client-ca-file"
	// authorizedTTL and unauthorizedTTL are how long the kubelet's webhook authorizer caches
	// an answer (its authorization.webhook defaults).
	authorizedTTL   = 5 * time.Minute
	unauthorizedTTL = 30 * time.Second
)

// kubeletAPI serves the part of the kubelet's API that kubectl reaches through the API server:
// /containerLogs (kubectl logs) and /exec (kubectl exec, kubectl lifeboat console). It
// authenticates and authorizes as a kubelet with authentication.x509.clientCAFile set,
// anonymous access off and webhook authorization does: a client certificate signed by the
// cluster's client CA names the caller, and a SubjectAccessReview asks the API server whether
// it may use the node's API (nodes/proxy, for both). The API server's --kubelet-client-certificate
// is such a caller. The serving certificate is the node's own, self-signed, as a kubelet's is by
// default; the API server does not check it without --kubelet-certificate-authority.
type kubeletAPI struct {
	nodeName string
	client   kubernetes.Interface
	pods     corelisters.PodLister
	runtime  *podRuntime
	layout   layout
	logger   klog.Logger

	listener net.Listener
	server   *http.Server
	served   sync.WaitGroup

	decisionsMu sync.Mutex
	decisions   map[string]decision
	// freezer holds requests while the node is frozen.
	freezer *freezer
}

type decision struct {
	allowed bool
	reason  string
	until   time.Time
}

// listenKubeletAPI listens on the node's kubelet port with a serving certificate for the node and
// the API server's client CA, read from the API server. It serves once serve is called.
func listenKubeletAPI(ctx context.Context, cfg Config) (*kubeletAPI, error) {
	clientCAs, err := clientCA(ctx, cfg.Client)
	if err != nil {
		return nil, err
	}
	cert, err := selfSignedCert(cfg.Name, cfg.Address)
	if err != nil {
		return nil, fmt.Errorf("making the kubelet API's serving certificate: %w", err)
	}
	listener, err := net.Listen("tcp", net.JoinHostPort(cfg.Address, strconv.Itoa(cfg.KubeletPort)))
	if err != nil {
		return nil, fmt.Errorf("listening for the kubelet API: %w", err)
	}
	a := &kubeletAPI{nodeName: cfg.Name, client: cfg.Client, logger: cfg.Logger, listener: listener, decisions: map[string]decision{}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /containerLogs/{namespace}/{pod}/{container}", a.containerLogs)
	mux.HandleFunc("/exec/{namespace}/{pod}/{container}", a.exec)
	mux.HandleFunc("/exec/{namespace}/{pod}/{uid}/{container}", a.exec)
	a.server = &http.Server{
		Handler: a.authenticated(mux),
		TLSConfig: &tls.Config{
			MinVersion:   tls.VersionTLS12,
			Certificates: []tls.Certificate{cert},
			// A caller without a certificate gets 401 from the handler, as from a kubelet.
			ClientAuth: tls.VerifyClientCertIfGiven,
			ClientCAs:  clientCAs,
		},
		// HTTP/1.1 only: exec upgrades the connection, which HTTP/2 cannot.
		TLSNextProto:      map[string]func(*http.Server, *tls.Conn, http.Handler){},
		ReadHeaderTimeout: 30 * time.Second,
		// Refused handshakes, among others.
		ErrorLog: log.New(logWriter{cfg.Logger}, "", 0),
	}
	return a, nil
}

// logWriter passes the HTTP server's messages on to the node's log.
type logWriter struct{ logger klog.Logger }

func (w logWriter) Write(p []byte) (int, error) {
	w.logger.V(2).Info("Kubelet API", "message", strings.TrimSpace(string(p)))
	return len(p), nil
}

// port is the port the API listens on.
func (a *kubeletAPI) port() int { return a.listener.Addr().(*net.TCPAddr).Port }

// serve answers requests about the node's pods until close.
func (a *kubeletAPI) serve(pods corelisters.PodLister, runtime *podRuntime, l layout) {
	a.pods, a.runtime, a.layout = pods, runtime, l
	a.served.Go(func() {
		if err := a.server.ServeTLS(a.listener, "", ""); err != nil && !errors.Is(err, http.ErrServerClosed) {
			a.logger.Error(err, "Serving the kubelet API")
		}
	})
}

// close stops serving: open connections are closed, except the streams of exec sessions, which
// end with their commands.
func (a *kubeletAPI) close() {
	_ = a.server.Close()
	_ = a.listener.Close()
	a.served.Wait()
}

// clientCA reads the CA the API server authenticates client certificates with.
func clientCA(ctx context.Context, client kubernetes.Interface) (*x509.CertPool, error) {
	cm, err := client.CoreV1().ConfigMaps(metav1.NamespaceSystem).Get(ctx, clientCAConfigMap, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("reading the API server's client CA (configmap %s/%s): %w", metav1.NamespaceSystem, clientCAConfigMap, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM([]byte(cm.Data[clientCAConfigMapKey])) {
		return nil, fmt.Errorf("configmap %s/%s has no certificate in %s", metav1.NamespaceSystem, clientCAConfigMap, clientCAConfigMapKey)
	}
	return pool, nil
}

// selfSignedCert is a certificate for the node's name and address, signed by its own key, as
// the kubelet makes one when it is given none.
func selfSignedCert(name, address string) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return tls.Certificate{}, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: fmt.Sprintf("%s@%d", name, now.Unix())},
		DNSNames:     []string{name},
		IPAddresses:  []net.IP{net.ParseIP(address)},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

// authenticated lets through the requests of callers with a verified client certificate whom
// the API server allows the node's API, as the kubelet's auth filter does: 401 without such a
// certificate, 403 for a caller the API server refuses.
func (a *kubeletAPI) authenticated(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if a.freezer != nil {
			// A frozen kubelet answers nothing until it thaws.
			a.freezer.waitThawed(r.Context())
		}
		if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 {
			http.Error(w, "Unauthorized", http.StatusUnauthorized)
			return
		}
		subject := r.TLS.VerifiedChains[0][0].Subject
		user, groups := subject.CommonName, subject.Organization
		verb := apiVerb(r.Method)
		// Everything served here is nodes/proxy to the kubelet (auth.go GetRequestAttributes).
		const subresource = "proxy"
		allowed, reason, err := a.authorize(r.Context(), user, groups, verb, subresource)
		if err != nil {
			a.logger.Error(err, "Authorization error", "user", user, "verb", verb, "resource", "nodes", "subresource", subresource)
			http.Error(w, fmt.Sprintf("Authorization error (user=%s, verb=%s, resource=nodes, subresource=%s)", user, verb, subresource), http.StatusInternalServerError)
			return
		}
		if !allowed {
			a.logger.V(2).Info("Forbidden", "user", user, "verb", verb, "resource", "nodes", "subresource(s)", []string{subresource}, "reason", reason)
			http.Error(w, fmt.Sprintf("Forbidden (user=%s, verb=%s, resource=nodes, subresource(s)=[%s])", user, verb, subresource), http.StatusForbidden)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// apiVerb is the verb the kubelet authorizes a request's method as.
func apiVerb(method string) string {
	switch method {
	case http.MethodPost:
		return "create"
	case http.MethodGet:
		return "get"
	case http.MethodPut:
		return "update"
	case http.MethodPatch:
		return "patch"
	case http.MethodDelete:
		return "delete"
	}
	return ""
}

// authorize asks the API server whether user may verb the node's subresource, remembering the
// answer as long as the kubelet does.
func (a *kubeletAPI) authorize(ctx context.Context, user string, groups []string, verb, subresource string) (bool, string, error) {
	key := strings.Join([]string{user, strings.Join(groups, ","), verb, subresource}, "\x00")
	now := time.Now()
	a.decisionsMu.Lock()
	d, ok := a.decisions[key]
	a.decisionsMu.Unlock()
	if ok && now.Before(d.until) {
		return d.allowed, d.reason, nil
	}
	review, err := a.client.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
		Spec: authorizationv1.SubjectAccessReviewSpec{
			User: user, Groups: slices.Clone(groups),
			ResourceAttributes: &authorizationv1.ResourceAttributes{
				Verb: verb, Version: "v1", Resource: "nodes", Subresource: subresource, Name: a.nodeName,
			},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return false, "", err
	}
	d = decision{allowed: review.Status.Allowed, reason: review.Status.Reason, until: now.Add(unauthorizedTTL)}
	if d.allowed {
		d.until = now.Add(authorizedTTL)
	}
	a.decisionsMu.Lock()
	a.decisions[key] = d
	a.decisionsMu.Unlock()
	return d.allowed, d.reason, nil
}

// apiError carries the status the kubelet answers a request with.
type apiError struct {
	status int
	msg    string
}

func (e *apiError) Error() string { return e.msg }

func notFound(format string, args ...any) error {
	return &apiError{status: http.StatusNotFound, msg: fmt.Sprintf(format, args...)}
}

func badRequest(format string, args ...any) error {
	return &apiError{status: http.StatusBadRequest, msg: fmt.Sprintf(format, args...)}
}

func writeError(w http.ResponseWriter, err error) {
	var e *apiError
	if errors.As(err, &e) {
		http.Error(w, e.msg, e.status)
		return
	}
	http.Error(w, err.Error(), http.StatusInternalServerError)
}

// podContainer finds the pod of the request among the node's, and its container's spec.
func (a *kubeletAPI) podContainer(r *http.Request) (*corev1.Pod, *corev1.Container, error) {
	namespace, name, container := r.PathValue("namespace"), r.PathValue("pod"), r.PathValue("container")
	pod, err := a.pods.Pods(namespace).Get(name)
	if apierrors.IsNotFound(err) {
		return nil, nil, notFound("pod %q does not exist", name)
	}
	if err != nil {
		return nil, nil, err
	}
	if uid := r.PathValue("uid"); uid != "" && uid != string(pod.UID) {
		return nil, nil, notFound("pod %q with UID %s does not exist", name, uid)
	}
	for i := range pod.Spec.Containers {
		if pod.Spec.Containers[i].Name == container {
			return pod, &pod.Spec.Containers[i], nil
		}
	}
	return nil, nil, notFound("container %q not found in pod %q", container, name)
}
