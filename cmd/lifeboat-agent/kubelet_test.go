package main

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"k8s.io/client-go/rest"

	"github.com/lifeboat-vm/lifeboat/agent"
	"github.com/lifeboat-vm/lifeboat/agent/pressure"
)

// TestKubeletSettingsComeFromTheFirstSourceThatAnswers: the kubelet's /configz (asked with the
// agent's token, over TLS it does not verify), else the file, else the upstream defaults with
// --eviction-max-pod-grace-period.
func TestKubeletSettingsComeFromTheFirstSourceThatAnswers(t *testing.T) {
	kubelet := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/configz" || r.Header.Get("Authorization") != "Bearer agent-token" {
			http.Error(w, "Forbidden", http.StatusForbidden)
			return
		}
		_, _ = io.WriteString(w, `{"kubeletconfig":{"kind":"KubeletConfiguration","evictionSoft":{"memory.available":"1Gi"},"evictionHard":{"memory.available":"100Mi"},"evictionMaxPodGracePeriod":60}}`)
	}))
	defer kubelet.Close()
	host, portText, err := net.SplitHostPort(kubelet.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	port, _ := strconv.Atoi(portText)
	file := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(file, []byte("kind: KubeletConfiguration\nevictionMaxPodGracePeriod: 30\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	configz := pressure.KubeletSettings{Thresholds: pressure.Thresholds{Soft: pressure.Threshold{Bytes: 1 << 30}, Hard: pressure.Threshold{Bytes: 100 << 20}}, MaxPodGracePeriod: 60}
	fromFile := pressure.UpstreamKubeletSettings
	fromFile.MaxPodGracePeriod = 30
	withFlag := pressure.UpstreamKubeletSettings
	withFlag.MaxPodGracePeriod = 12
	for _, tc := range []struct {
		name       string
		o          options
		token      string
		want       pressure.KubeletSettings
		wantSource string
	}{
		{"the kubelet answers", options{nodeAddress: host, kubeletPort: port, kubeletConfig: file, maxPodGracePeriod: -1}, "agent-token", configz, agent.KubeletSourceConfigz},
		{"the kubelet refuses: the file", options{nodeAddress: host, kubeletPort: port, kubeletConfig: file, maxPodGracePeriod: -1}, "other", fromFile, agent.KubeletSourceFile},
		{"no kubelet port, no file: the defaults", options{nodeAddress: host, kubeletConfig: filepath.Join(t.TempDir(), "missing"), maxPodGracePeriod: -1}, "agent-token", pressure.UpstreamKubeletSettings, agent.KubeletSourceDefaults},
		{"the defaults with the flag's grace", options{nodeAddress: host, maxPodGracePeriod: 12}, "agent-token", withFlag, agent.KubeletSourceDefaults},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, source, err := kubeletSettings(context.Background(), tc.o, &rest.Config{BearerToken: tc.token}, slog.New(slog.NewTextHandler(io.Discard, nil)))
			if err != nil || got != tc.want || source != tc.wantSource {
				t.Errorf("kubeletSettings() = %+v, %s, %v; want %+v, %s", got, source, err, tc.want, tc.wantSource)
			}
		})
	}
}
