// Package deviceplugin serves the node's VM devices (/dev/kvm, /dev/net/tun, /dev/userfaultfd)
// to the kubelet as extended resources devices.lifeboat.dev/*, through the
// kubelet's device plugin API (v1beta1), so that launcher pods get them without privilege and
// the scheduler places a VM only where its devices are.
package deviceplugin

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/apimachinery/pkg/util/wait"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/lifeboat-vm/lifeboat/api/lifeboat/v1alpha1"
)

// Device is a device node the agent hands to launcher pods.
type Device struct {
	// Name is the resource's name after the prefix: devices.lifeboat.dev/<Name>.
	Name string
	// Path is the device node, the same on the node and in the container.
	Path string
}

// Resource is the extended resource name of d.
func (d Device) Resource() string { return v1alpha1.DeviceResourcePrefix + d.Name }

// Devices are the devices lifeboat serves; Present says which of them a node has. Only devices a
// launcher asks for: each is a kernel interface handed out without privilege, so /dev/vhost-net,
// which no launcher's QEMU uses (its taps are plain), is not one of them.
var (
	KVM         = Device{Name: "kvm", Path: "/dev/kvm"}
	Tun         = Device{Name: "tun", Path: "/dev/net/tun"}
	UserFaultFD = Device{Name: "userfaultfd", Path: "/dev/userfaultfd"}
	Devices     = []Device{KVM, Tun, UserFaultFD}
)

// Timings of the plugin's watch on the kubelet, and of its health checks.
const (
	// watchInterval: how often the plugin checks that the kubelet still knows it. A restarted
	// kubelet removes every socket in the plugin directory and makes its own anew.
	watchInterval = time.Second
	// healthInterval: how often the device is checked; a device that went away is
	// reported unhealthy, and the kubelet stops admitting pods that need it.
	healthInterval = 10 * time.Second
	dialTimeout    = 5 * time.Second
)

// Plugin serves one device to the kubelet, as Slots interchangeable devices (a device node can be
// opened by every VM on the node; the slots bound how many pods may ask for it).
type Plugin struct {
	pluginapi.UnimplementedDevicePluginServer
	Device Device
	Slots  int
	// Dir is the kubelet's device plugin directory, where kubelet.sock is.
	Dir string
	Log *slog.Logger
	// Registered, if set, is called each time the kubelet takes a registration up: it asked for
	// the device list and was sent it, so it can admit pods that need the device.
	Registered func()
	// present reports whether the node still has the device; Present by default.
	present func(Device) bool
	// instance tells this plugin's socket from an earlier agent's: the kubelet keys plugins by
	// socket path, refuses a second registration on a path it still holds, and drops a
	// resource's devices when its last socket's connection ends, so a new agent registers on
	// its own path before the old one's connection goes.
	instance string
}

// socket is the plugin's own socket in the kubelet's directory.
func (p *Plugin) socket() string {
	return filepath.Join(p.Dir, "lifeboat-"+p.Device.Name+"-"+p.instance+".sock")
}

// kubeletSocket is where the kubelet takes registrations.
func (p *Plugin) kubeletSocket() string {
	return filepath.Join(p.Dir, filepath.Base(pluginapi.KubeletSocket))
}

// Run serves the device until ctx ends: it waits for the kubelet, registers, and registers again
// whenever the kubelet restarts.
func (p *Plugin) Run(ctx context.Context) {
	if p.present == nil {
		p.present = Present
	}
	p.instance = strconv.FormatInt(time.Now().UnixNano(), 36)
	log := p.Log.With("resource", p.Device.Resource())
	// Non-sliding: after a kubelet restart the next registration comes at once, after an error
	// within a second.
	wait.NonSlidingUntilWithContext(ctx, func(ctx context.Context) {
		var kubelet os.FileInfo
		err := wait.PollUntilContextCancel(ctx, watchInterval, true, func(context.Context) (bool, error) {
			fi, err := os.Stat(p.kubeletSocket())
			kubelet = fi
			return err == nil, nil
		})
		if err != nil {
			return // ctx ended
		}
		if err := p.serveOnce(ctx, kubelet, log); err != nil {
			log.Error("device plugin: will try again", "err", err)
		}
	}, watchInterval)
}

// removeStale removes sockets an earlier agent left for this device; a connection the kubelet
// still holds on one is not affected.
func (p *Plugin) removeStale() {
	stale, _ := filepath.Glob(filepath.Join(p.Dir, "lifeboat-"+p.Device.Name+"-*.sock"))
	for _, f := range stale {
		if f != p.socket() {
			_ = os.Remove(f)
		}
	}
}

// serveOnce serves and registers once, and returns when the kubelet no longer knows the plugin
// (its socket was removed, or the kubelet's changed) or ctx ends.
func (p *Plugin) serveOnce(ctx context.Context, kubelet os.FileInfo, log *slog.Logger) error {
	p.removeStale()
	_ = os.Remove(p.socket())
	lis, err := net.Listen("unix", p.socket())
	if err != nil {
		return fmt.Errorf("listening on %s: %w", p.socket(), err)
	}
	server := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(server, p)
	served := make(chan error, 1)
	go func() { served <- server.Serve(lis) }()
	defer server.Stop()

	if err := p.register(ctx); err != nil {
		return err
	}
	log.Info("registered with the kubelet", "socket", p.socket(), "slots", p.Slots)
	ticker := time.NewTicker(watchInterval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			_ = os.Remove(p.socket())
			return nil
		case err := <-served:
			return fmt.Errorf("serving: %w", err)
		case <-ticker.C:
		}
		if _, err := os.Stat(p.socket()); err != nil {
			log.Info("the kubelet removed the plugin's socket (it restarted): registering again")
			return nil
		}
		if now, err := os.Stat(p.kubeletSocket()); err != nil || !os.SameFile(now, kubelet) {
			log.Info("the kubelet's socket changed (it restarted): registering again")
			return nil
		}
	}
}

// register tells the kubelet about the plugin's socket and resource.
func (p *Plugin) register(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, dialTimeout)
	defer cancel()
	conn, err := grpc.NewClient("unix://"+p.kubeletSocket(),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("connecting to the kubelet: %w", err)
	}
	defer conn.Close()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     filepath.Base(p.socket()),
		ResourceName: p.Device.Resource(),
	})
	if err != nil {
		return fmt.Errorf("registering %s with the kubelet: %w", p.Device.Resource(), err)
	}
	return nil
}

// GetDevicePluginOptions: nothing to do before a container starts, no preferred allocation.
func (p *Plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

// ListAndWatch sends the slots, healthy while the device node is there, and again on each change.
func (p *Plugin) ListAndWatch(_ *pluginapi.Empty, stream grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	healthy := p.present(p.Device)
	for first := true; ; first = false {
		if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: slots(p.Device.Name, p.Slots, healthy)}); err != nil {
			return err
		}
		if first && p.Registered != nil {
			p.Registered()
		}
		err := wait.PollUntilContextCancel(stream.Context(), healthInterval, false, func(context.Context) (bool, error) {
			return p.present(p.Device) != healthy, nil
		})
		if err != nil {
			return nil // the kubelet closed the stream
		}
		healthy = !healthy
	}
}

// Allocate gives every container that asks the device node itself, read-write; the slots it was
// given are all the same device.
func (p *Plugin) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for range req.ContainerRequests {
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{
			Devices: []*pluginapi.DeviceSpec{{ContainerPath: p.Device.Path, HostPath: p.Device.Path, Permissions: "rw"}},
		})
	}
	return resp, nil
}

// slots are n devices named <name>-<i>, all healthy or all not.
func slots(name string, n int, healthy bool) []*pluginapi.Device {
	health := pluginapi.Healthy
	if !healthy {
		health = pluginapi.Unhealthy
	}
	devices := make([]*pluginapi.Device, n)
	for i := range devices {
		devices[i] = &pluginapi.Device{ID: name + "-" + strconv.Itoa(i), Health: health}
	}
	return devices
}

// Present reports whether the node's kernel has d: its misc device is registered in sysfs
// (/sys/class/misc/<name>), which a container sees without any node path. KVM's registers only
// when the CPU's virtualisation works; whether a nested KVM boots Linux is the launcher's probe.
func Present(d Device) bool { return presentIn("/sys/class/misc", d) }

func presentIn(sysMisc string, d Device) bool {
	_, err := os.Stat(filepath.Join(sysMisc, filepath.Base(d.Path), "dev"))
	return err == nil
}
