package webhook

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"testing"
	"time"
)

func testCA(t *testing.T, name string, notAfter time.Time) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: notAfter.Add(-48 * time.Hour), NotAfter: notAfter, IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func TestMergeBundles(t *testing.T) {
	now := time.Date(2026, 11, 22, 6, 0, 0, 0, time.UTC)
	mine, other, expired := testCA(t, "mine", now.Add(time.Hour)), testCA(t, "other", now.Add(time.Hour)), testCA(t, "expired", now.Add(-time.Minute))
	cases := []struct {
		name         string
		own, others  []byte
		want, absent [][]byte
	}{
		{"first replica: its own CA", mine, nil, [][]byte{mine}, nil},
		{"another replica's valid CA is kept", mine, other, [][]byte{mine, other}, nil},
		{"an expired CA is dropped", mine, append(append([]byte{}, other...), expired...), [][]byte{mine, other}, [][]byte{expired}},
		{"its own CA is not repeated", mine, append(append([]byte{}, mine...), other...), [][]byte{mine, other}, nil},
		{"garbage is dropped", mine, []byte("-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n"), [][]byte{mine}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := MergeBundles(tc.own, tc.others, now)
			n := 0
			for rest := got; ; n++ {
				var b *pem.Block
				if b, rest = pem.Decode(rest); b == nil {
					break
				}
			}
			if n != len(tc.want) {
				t.Errorf("%d certificates, want %d", n, len(tc.want))
			}
			for _, w := range tc.want {
				if !bytes.Contains(got, bytes.TrimSpace(w)) {
					t.Errorf("missing a certificate that must be trusted")
				}
			}
			for _, a := range tc.absent {
				if bytes.Contains(got, bytes.TrimSpace(a)) {
					t.Errorf("an expired certificate is still trusted")
				}
			}
			if !bytes.HasPrefix(got, bytes.TrimSpace(tc.own)) {
				t.Errorf("the replica's own CA must come first")
			}
		})
	}
}
