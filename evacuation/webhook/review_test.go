package webhook

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
)

func TestDecodeReview(t *testing.T) {
	good := `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u","name":"launcher-vm-1","namespace":"ns","operation":"CREATE","subResource":"eviction"}}`
	cases := []struct {
		name, body, err string
	}{
		{"a review", good, ""},
		{"no request", `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}`, "no request"},
		{"not JSON", `evict everything`, "invalid character"},
		{"larger than a review can be", `{"request":{"name":"` + strings.Repeat("a", maxReviewBytes) + `"}}`, "larger than"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r, err := decodeReview(strings.NewReader(tc.body))
			if tc.err == "" {
				if err != nil || r.Request.Name != "launcher-vm-1" {
					t.Fatalf("decodeReview() = %+v, %v; want the request for launcher-vm-1", r, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("decodeReview() error = %v, want one containing %q", err, tc.err)
			}
		})
	}
}

// FuzzDecodeReview: whatever a caller sends, decoding returns a review with a request or an
// error, and never panics.
func FuzzDecodeReview(f *testing.F) {
	seed, _ := json.Marshal(admissionv1.AdmissionReview{Request: &admissionv1.AdmissionRequest{UID: "u", Name: "launcher-vm", Namespace: "ns", SubResource: "eviction"}})
	f.Add(seed)
	f.Add([]byte(`{"request":null}`))
	f.Add([]byte(`{"request":{"userInfo":{"extra":{"a":["b"]}}}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := decodeReview(bytes.NewReader(data))
		if err == nil && (r == nil || r.Request == nil) {
			t.Fatalf("decodeReview(%q) returned no request and no error", data)
		}
	})
}
