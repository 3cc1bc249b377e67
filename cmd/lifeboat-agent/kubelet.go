package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"time"

	"k8s.io/client-go/rest"

	"github.com/lifeboat-vm/lifeboat/agent"
	"github.com/lifeboat-vm/lifeboat/agent/pressure"
)

// configzTimeout bounds the read of the kubelet's /configz: an agent that cannot have it starts
// with what it can read instead.
const configzTimeout = 10 * time.Second

// kubeletSettings reads the node kubelet's eviction settings, once at start, from the first
// source that answers: the kubelet's live configuration (/configz on its authenticated port,
// with the agent's own credentials: RBAC nodes/configz), the file --kubelet-config names, or
// else the upstream defaults with --eviction-max-pod-grace-period if given. It says which.
func kubeletSettings(ctx context.Context, o options, restConfig *rest.Config, log *slog.Logger) (pressure.KubeletSettings, string, error) {
	data, err := readConfigz(ctx, restConfig, o.nodeAddress, o.kubeletPort)
	if err == nil {
		s, err := pressure.ReadKubeletConfig(data)
		if err != nil {
			return pressure.KubeletSettings{}, "", fmt.Errorf("the kubelet's /configz: %w", err)
		}
		return s, agent.KubeletSourceConfigz, nil
	}
	log.Warn("the kubelet's live configuration could not be read (the agent needs nodes/configz and to reach the kubelet's port)", "err", err)
	if o.kubeletConfig != "" {
		data, err := os.ReadFile(o.kubeletConfig)
		if err == nil {
			s, err := pressure.ReadKubeletConfig(data)
			if err != nil {
				return pressure.KubeletSettings{}, "", fmt.Errorf("%s: %w", o.kubeletConfig, err)
			}
			return s, agent.KubeletSourceFile, nil
		}
		log.Warn("the kubelet's configuration file could not be read", "err", err)
	}
	s := pressure.UpstreamKubeletSettings
	if o.maxPodGracePeriod >= 0 {
		s.MaxPodGracePeriod = o.maxPodGracePeriod
	}
	return s, agent.KubeletSourceDefaults, nil
}

// readConfigz reads the kubelet's /configz at the node's address. The connection stays on the
// node (the agent is on its network), and does not check the kubelet's serving certificate,
// which most kubelets sign themselves, as the API server does not by default either.
func readConfigz(ctx context.Context, restConfig *rest.Config, address string, port int) ([]byte, error) {
	if address == "" || port == 0 {
		return nil, errors.New("no --node-address or --kubelet-port")
	}
	ctx, cancel := context.WithTimeout(ctx, configzTimeout)
	defer cancel()
	// The agent's credentials (its service account token in a cluster), and no CA.
	client, err := rest.HTTPClientFor(&rest.Config{
		BearerToken: restConfig.BearerToken, BearerTokenFile: restConfig.BearerTokenFile,
		TLSClientConfig: rest.TLSClientConfig{Insecure: true,
			CertFile: restConfig.CertFile, KeyFile: restConfig.KeyFile, CertData: restConfig.CertData, KeyData: restConfig.KeyData},
	})
	if err != nil {
		return nil, err
	}
	url := "https://" + net.JoinHostPort(address, strconv.Itoa(port)) + "/configz"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", url, resp.Status)
	}
	return body, nil
}
