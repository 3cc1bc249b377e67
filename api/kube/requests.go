package kube

import (
	"net/http"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

// RequestsMetric counts the calls a component makes to the API server, by verb and resource, as
// KubeVirt's performance suite counts them client-side (PATCH pods, UPDATE VMIs, GET nodes...):
// what a VMI's start, an evacuation or an idle hour costs the API server, read from /metrics.
var RequestsMetric = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "lifeboat_apiserver_requests_total",
	Help: "Requests to the API server, by verb (get, list, watch, create, update, patch, delete, deletecollection) and resource (with its subresource, e.g. virtualmachineinstances/status).",
}, []string{"verb", "resource"})

// countingTransport counts each request in RequestsMetric before sending it.
type countingTransport struct{ next http.RoundTripper }

func (t countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	verb, resource := RequestKind(r)
	RequestsMetric.WithLabelValues(verb, resource).Inc()
	return t.next.RoundTrip(r)
}

// RequestKind is a request's verb and resource as the API server's audit and metrics name them:
// /api/v1/namespaces/ns/pods/p/status with PUT is (update, pods/status); a GET without a name is a
// list, or a watch with watch=true. A path outside the resource API (discovery, /healthz) is
// (get, "") for any GET.
func RequestKind(r *http.Request) (verb, resource string) {
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	switch {
	case len(parts) >= 3 && parts[0] == "api":
		parts = parts[2:]
	case len(parts) >= 4 && parts[0] == "apis":
		parts = parts[3:]
	default:
		parts = nil
	}
	if len(parts) >= 2 && parts[0] == "namespaces" && len(parts) != 2 {
		parts = parts[2:] // a namespaced resource; namespaces/ns alone is the namespace itself
	}
	var name string
	switch len(parts) {
	case 0:
	case 1:
		resource = parts[0]
	case 2:
		resource, name = parts[0], parts[1]
	default:
		resource, name = parts[0]+"/"+parts[2], parts[1]
	}
	switch r.Method {
	case http.MethodGet:
		verb = "get"
		if r.URL.Query().Get("watch") == "true" || r.URL.Query().Get("watch") == "1" {
			verb = "watch"
		} else if name == "" && resource != "" {
			verb = "list"
		}
	case http.MethodPost:
		verb = "create"
	case http.MethodPut:
		verb = "update"
	case http.MethodPatch:
		verb = "patch"
	case http.MethodDelete:
		verb = "delete"
		if name == "" {
			verb = "deletecollection"
		}
	default:
		verb = strings.ToLower(r.Method)
	}
	return verb, resource
}
