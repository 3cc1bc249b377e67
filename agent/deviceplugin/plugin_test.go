package deviceplugin

import (
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

// kubelet plays the kubelet's registration service on a real unix socket; the real kubelet's
// part is in test/e2e (TestDevicesReachLauncherPodsThroughTheKubelet).
type kubelet struct {
	pluginapi.UnimplementedRegistrationServer
	dir     string
	server  *grpc.Server
	request chan *pluginapi.RegisterRequest
}

func startKubelet(t *testing.T, dir string, requests chan *pluginapi.RegisterRequest) *kubelet {
	t.Helper()
	k := &kubelet{dir: dir, server: grpc.NewServer(), request: requests}
	pluginapi.RegisterRegistrationServer(k.server, k)
	lis, err := net.Listen("unix", filepath.Join(dir, "kubelet.sock"))
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = k.server.Serve(lis) }()
	return k
}

func (k *kubelet) Register(_ context.Context, r *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	k.request <- r
	return &pluginapi.Empty{}, nil
}

// restart does what a restarting kubelet does to the plugin directory: its socket goes, every
// plugin's socket is removed, and a new kubelet socket comes.
func (k *kubelet) restart(t *testing.T) *kubelet {
	k.server.Stop()
	entries, _ := os.ReadDir(k.dir)
	for _, e := range entries {
		_ = os.Remove(filepath.Join(k.dir, e.Name()))
	}
	return startKubelet(t, k.dir, k.request)
}

func waitRegistration(t *testing.T, requests chan *pluginapi.RegisterRequest, what string) *pluginapi.RegisterRequest {
	t.Helper()
	select {
	case r := <-requests:
		return r
	case <-time.After(10 * time.Second):
		t.Fatalf("no registration within 10s: %s", what)
		return nil
	}
}

func TestThePluginRegistersServesAndRegistersAgain(t *testing.T) {
	dir := t.TempDir()
	requests := make(chan *pluginapi.RegisterRequest, 4)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	healthy := true
	taken := make(chan struct{}, 4)
	p := &Plugin{Device: Tun, Slots: 3, Dir: dir, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		present: func(Device) bool { return healthy }, Registered: func() { taken <- struct{}{} }}
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()

	// An earlier agent's socket; the kubelet comes after the plugin, as on a node where the agent
	// starts first.
	stale := filepath.Join(dir, "lifeboat-tun-earlier.sock")
	if err := os.WriteFile(stale, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	k := startKubelet(t, dir, requests)
	r := waitRegistration(t, requests, "the kubelet started after the plugin")
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("an earlier agent's socket should be removed: %v", err)
	}
	if r.ResourceName != "devices.lifeboat.dev/tun" || r.Version != pluginapi.Version || !strings.HasPrefix(r.Endpoint, "lifeboat-tun-") {
		t.Fatalf("registration %+v: want devices.lifeboat.dev/tun, version %s, endpoint lifeboat-tun-<instance>.sock", r, pluginapi.Version)
	}

	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, r.Endpoint), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := pluginapi.NewDevicePluginClient(conn)
	stream, err := client.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	list, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Devices) != 3 || list.Devices[0].Health != pluginapi.Healthy || list.Devices[2].ID != "tun-2" {
		t.Errorf("devices %v: want 3 healthy slots tun-0..tun-2", list.Devices)
	}
	select {
	case <-taken:
	case <-time.After(5 * time.Second):
		t.Error("the registration should count as taken up once the kubelet has the device list")
	}
	alloc, err := client.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"tun-1"}}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := alloc.ContainerResponses[0].Devices; len(got) != 1 || got[0].HostPath != "/dev/net/tun" || got[0].ContainerPath != "/dev/net/tun" || got[0].Permissions != "rw" {
		t.Errorf("allocation %v: want /dev/net/tun read-write at the same path", got)
	}

	k.restart(t)
	waitRegistration(t, requests, "after the kubelet restarted")
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not end with its context")
	}
	if _, err := os.Stat(filepath.Join(dir, r.Endpoint)); !os.IsNotExist(err) {
		t.Errorf("the plugin's socket should be gone after Run: %v", err)
	}
}

func TestPresent(t *testing.T) {
	sys := t.TempDir()
	if err := os.MkdirAll(filepath.Join(sys, "tun"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(sys, "tun", "dev"), []byte("10:200\n"), 0o444); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		d    Device
		want bool
	}{{Tun, true}, {KVM, false}, {UserFaultFD, false}} {
		if got := presentIn(sys, tc.d); got != tc.want {
			t.Errorf("%s present = %v, want %v", tc.d.Resource(), got, tc.want)
		}
	}
}

// The agent offers exactly the devices launcher pods ask for (v1alpha1's Device* resources), no
// kernel interface more: every device offered is one any pod on the node could otherwise hold.
func TestOffersOnlyWhatLaunchersAskFor(t *testing.T) {
	var offered []string
	for _, d := range Devices {
		offered = append(offered, d.Resource())
	}
	want := []string{v1alpha1.DeviceKVM, v1alpha1.DeviceTun, v1alpha1.DeviceUserFaultFD}
	if !slices.Equal(offered, want) {
		t.Errorf("the agent offers %v, want exactly what launchers ask for, %v", offered, want)
	}
}
