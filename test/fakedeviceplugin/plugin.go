package fakedeviceplugin

import (
	"context"
	"maps"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// Plugin is the device plugin of one fake resource.
type Plugin struct {
	pluginapi.UnimplementedDevicePluginServer

	spec        Spec
	deviceSpecs bool

	mu        sync.Mutex
	unhealthy map[int]bool
	// changed is closed, and replaced, on every health change: each ListAndWatch stream waits
	// on the one it saw with its last send, so no change goes unsent.
	changed chan struct{}
}

// NewPlugin is the plugin of spec with every device healthy; deviceSpecs adds device nodes to
// allocations (see the package documentation).
func NewPlugin(spec Spec, deviceSpecs bool) *Plugin {
	return &Plugin{spec: spec, deviceSpecs: deviceSpecs, unhealthy: map[int]bool{}, changed: make(chan struct{})}
}

// Spec is the resource the plugin serves.
func (p *Plugin) Spec() Spec { return p.spec }

// SetUnhealthy makes exactly the devices in unhealthy Unhealthy (indices out of range are
// ignored) and tells every ListAndWatch stream if that changed anything.
func (p *Plugin) SetUnhealthy(unhealthy map[int]bool) {
	next := map[int]bool{}
	for i, bad := range unhealthy {
		if bad && i >= 0 && i < p.spec.Count {
			next[i] = true
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if maps.Equal(next, p.unhealthy) {
		return
	}
	for i := range p.spec.Count {
		if next[i] != p.unhealthy[i] {
			klog.InfoS("Device health changed", "resource", p.spec.ResourceName, "device", DeviceID(p.spec.Kind, i), "healthy", !next[i])
		}
	}
	p.unhealthy = next
	close(p.changed)
	p.changed = make(chan struct{})
}

// devices is the device list as ListAndWatch sends it, and the channel closed on the next
// change.
func (p *Plugin) devices() ([]*pluginapi.Device, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	devs := make([]*pluginapi.Device, p.spec.Count)
	for i := range devs {
		health := pluginapi.Healthy
		if p.unhealthy[i] {
			health = pluginapi.Unhealthy
		}
		devs[i] = &pluginapi.Device{ID: DeviceID(p.spec.Kind, i), Health: health}
	}
	return devs, p.changed
}

// GetDevicePluginOptions says GetPreferredAllocation is available and PreStartContainer is not
// needed.
func (p *Plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return options(), nil
}

func options() *pluginapi.DevicePluginOptions {
	return &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true}
}

// ListAndWatch sends the device list now and again on every health change, until the
// kubelet goes away or the server stops.
func (p *Plugin) ListAndWatch(_ *pluginapi.Empty, stream grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	for {
		devs, changed := p.devices()
		if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: devs}); err != nil {
			return err
		}
		select {
		case <-changed:
		case <-stream.Context().Done():
			return nil
		}
	}
}

// GetPreferredAllocation answers with PreferredAllocation for each container.
func (p *Plugin) GetPreferredAllocation(_ context.Context, r *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	resp := &pluginapi.PreferredAllocationResponse{}
	for _, c := range r.GetContainerRequests() {
		ids := PreferredAllocation(p.spec, c.GetAvailableDeviceIDs(), c.GetMustIncludeDeviceIDs(), int(c.GetAllocationSize()))
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerPreferredAllocationResponse{DeviceIDs: ids})
	}
	return resp, nil
}

// Allocate answers with ContainerResponse for each container; an unknown device ID fails
// the whole request.
func (p *Plugin) Allocate(_ context.Context, r *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for _, c := range r.GetContainerRequests() {
		cr, err := ContainerResponse(p.spec, c.GetDevicesIds(), p.deviceSpecs)
		if err != nil {
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
		klog.InfoS("Allocated", "resource", p.spec.ResourceName, "devices", c.GetDevicesIds())
		resp.ContainerResponses = append(resp.ContainerResponses, cr)
	}
	return resp, nil
}

// PreStartContainer has nothing to do: there is no device to reset.
func (p *Plugin) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}
