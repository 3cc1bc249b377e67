package realnode

import (
	"strings"
	"testing"
)

// TestStartRefusesBadConfigs: each mistake is named, and nothing is started.
func TestStartRefusesBadConfigs(t *testing.T) {
	good := Config{Name: "real-1", Address: "127.0.0.31", Kubeconfig: cluster.Kubeconfig, Client: cluster.Kube}
	for _, tc := range []struct {
		name   string
		mutate func(*Config)
		want   string
	}{
		{"address outside loopback", func(c *Config) { c.Address = "10.0.0.1" }, `address "10.0.0.1" is not an IPv4 address in 127.0.0.0/8`},
		{"IPv6 loopback", func(c *Config) { c.Address = "::1" }, `address "::1" is not an IPv4 address`},
		{"no address", func(c *Config) { c.Address = "" }, `address "" is not`},
		{"no name", func(c *Config) { c.Name = "" }, "needs a name, a kubeconfig and a client"},
		{"no client", func(c *Config) { c.Client = nil }, "needs a name, a kubeconfig and a client"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := good
			tc.mutate(&cfg)
			n, err := Start(t.Context(), cfg)
			if err == nil {
				n.Stop()
				t.Fatal("Start accepted the configuration")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not say %q", err, tc.want)
			}
		})
	}
}
