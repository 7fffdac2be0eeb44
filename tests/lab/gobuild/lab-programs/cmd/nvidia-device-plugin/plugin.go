package main

// The DevicePlugin gRPC service (k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1) for nvidia.com/gpu, answering as
// NVIDIA's plugin v0.20 answers with its defaults (device-list-strategy envvar, device-id-strategy uuid, no CDI,
// no device specs passed, health checks on).

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

const (
	resourceName      = "nvidia.com/gpu"
	socketName        = "nvidia-gpu.sock" // "nvidia-" + the resource's name part, as the real plugin names it
	kubeletSocketName = "kubelet.sock"
	deviceListEnvVar  = "NVIDIA_VISIBLE_DEVICES"
	registerTimeout   = 5 * time.Second
)

// device: one GPU offered as nvidia.com/gpu. The set is fixed when the plugin starts, as the real plugin's is.
type device struct {
	ID     string // the GPU's UUID
	index  int    // its NVML index when the plugin started
	slot   int    // its fake-nvml slot (stable across removals)
	name   string
	busID  string
	health string
}

// enumerate: the devices of a freshly initialised NVML. A GPU that is already lost fails the enumeration, and
// with it the plugin's start, as NVML's device handle call fails in the real plugin's device discovery.
func enumerate(state *nvmlState) ([]*device, error) {
	var devices []*device
	for index, gpu := range state.enumerated() {
		if gpu.Lost {
			return nil, fmt.Errorf("error building device map: error visiting devices: "+
				"error getting device handle for index '%d': %v", index, errGPUIsLost)
		}
		devices = append(devices, &device{
			ID: gpu.UUID, index: index, slot: gpu.Slot, name: gpu.Name, busID: gpu.PCI.busID(),
			health: pluginapi.Healthy,
		})
	}
	return devices, nil
}

type devicePlugin struct {
	pluginapi.UnimplementedDevicePluginServer

	dir          string // the kubelet's device-plugin directory
	nvml         fakeNVML
	filter       xidFilter
	idStrategy   string
	pollInterval time.Duration
	devices      []*device

	mu       sync.Mutex
	baseline *nvmlState    // the last reading of the state: events are what changed since
	changed  chan struct{} // closed (and replaced) whenever a device's health changes
	server   *grpc.Server
	stop     chan struct{}
	done     sync.WaitGroup
}

func newDevicePlugin(cfg config, state *nvmlState, devices []*device) *devicePlugin {
	return &devicePlugin{
		dir: cfg.dir, nvml: cfg.nvml, filter: cfg.filter, idStrategy: cfg.idStrategy,
		pollInterval: cfg.pollInterval, devices: devices, baseline: state, changed: make(chan struct{}),
	}
}

func (p *devicePlugin) socket() string { return filepath.Join(p.dir, socketName) }

// start serves the plugin's socket, registers with the kubelet and starts watching the GPUs' health.
func (p *devicePlugin) start() error {
	_ = os.Remove(p.socket())
	listener, err := net.Listen("unix", p.socket())
	if err != nil {
		logf('I', "Could not start device plugin for '%s': %v", resourceName, err)
		return err
	}
	p.server = grpc.NewServer()
	p.stop = make(chan struct{})
	pluginapi.RegisterDevicePluginServer(p.server, p)
	logf('I', "Starting GRPC server for '%s'", resourceName)
	p.done.Add(1)
	go func() {
		defer p.done.Done()
		if err := p.server.Serve(listener); err != nil {
			logf('I', "GRPC server for '%s' crashed with error: %v", resourceName, err)
		}
	}()
	logf('I', "Starting to serve '%s' on %s", resourceName, p.socket())

	if err := p.register(); err != nil {
		logf('I', "Could not register device plugin: %v", err)
		p.shutdown()
		return err
	}
	logf('I', "Registered device plugin for '%s' with Kubelet", resourceName)

	if p.filter.off() {
		logf('I', "Health checks disabled (%s)", envDisableHealthChecks)
		return nil
	}
	logf('I', "Ignoring the following XIDs for health checks: %v", p.filter.ignoredList())
	p.done.Add(1)
	go p.watchHealth()
	return nil
}

func (p *devicePlugin) register() error {
	conn, err := grpc.NewClient("unix://"+filepath.Join(p.dir, kubeletSocketName),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), registerTimeout)
	defer cancel()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version:      pluginapi.Version,
		Endpoint:     socketName,
		ResourceName: resourceName,
		Options:      &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true},
	})
	return err
}

// shutdown stops serving and removes the socket (a no-op on a plugin that is not serving).
func (p *devicePlugin) shutdown() {
	if p == nil || p.server == nil {
		return
	}
	logf('I', "Stopping to serve '%s' on %s", resourceName, p.socket())
	close(p.stop)
	p.server.Stop()
	p.done.Wait()
	if err := os.Remove(p.socket()); err != nil && !errors.Is(err, os.ErrNotExist) {
		logf('E', "removing %s: %v", p.socket(), err)
	}
	p.server = nil
}

// watchHealth reads the simulated NVML every pollInterval and marks GPUs Unhealthy on the events it implies.
func (p *devicePlugin) watchHealth() {
	defer p.done.Done()
	logf('I', "Health monitoring started for %d devices", len(p.devices))
	ticker := time.NewTicker(p.pollInterval)
	defer ticker.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-ticker.C:
			p.checkHealth()
		}
	}
}

func (p *devicePlugin) checkHealth() {
	state, err := p.nvml.readState()
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		if p.anyHealthyLocked() {
			logf('I', "Error waiting for event: %v; marking all devices as unhealthy", err)
			for _, d := range p.devices {
				p.markUnhealthyLocked(d)
			}
		}
		return
	}
	for _, event := range driverEvents(p.baseline, state, p.devices) {
		switch {
		case event.xid == 0:
			logf('I', "Skipping non-nvmlEventTypeXidCriticalError event: %v", event)
		case p.filter.ignores(event.xid):
			logf('I', "Skipping event %v", event)
		default:
			logf('I', "Processing event %v", event)
			logf('I', "XidCriticalError: Xid=%d on Device=%s; marking device as unhealthy.", event.xid, event.uuid)
			p.markUnhealthyLocked(p.byID(event.uuid))
		}
	}
	p.baseline = state
}

func (p *devicePlugin) anyHealthyLocked() bool {
	for _, d := range p.devices {
		if d.health == pluginapi.Healthy {
			return true
		}
	}
	return false
}

func (p *devicePlugin) markUnhealthyLocked(d *device) {
	if d == nil || d.health == pluginapi.Unhealthy {
		return
	}
	d.health = pluginapi.Unhealthy
	logf('I', "'%s' device marked unhealthy: %s", resourceName, d.ID)
	close(p.changed)
	p.changed = make(chan struct{})
}

func (p *devicePlugin) byID(id string) *device {
	for _, d := range p.devices {
		if d.ID == id {
			return d
		}
	}
	return nil
}

// snapshot: the devices as the kubelet is told of them, and the channel closed at the next change.
func (p *devicePlugin) snapshot() ([]*pluginapi.Device, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	devices := make([]*pluginapi.Device, 0, len(p.devices))
	for _, d := range p.devices {
		// Topology stays unset: the real plugin reads the GPU's NUMA node from sysfs, where a lab GPU has none.
		devices = append(devices, &pluginapi.Device{ID: d.ID, Health: d.health})
	}
	return devices, p.changed
}

func (p *devicePlugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true}, nil
}

func (p *devicePlugin) ListAndWatch(_ *pluginapi.Empty, stream grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	for {
		devices, changed := p.snapshot()
		if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: devices}); err != nil {
			return err
		}
		select {
		case <-p.stop:
			return nil
		case <-stream.Context().Done():
			return nil
		case <-changed:
		}
	}
}

func (p *devicePlugin) Allocate(_ context.Context, request *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	response := &pluginapi.AllocateResponse{}
	for _, container := range request.ContainerRequests {
		var visible []string
		seen := map[string]bool{}
		for _, id := range container.DevicesIds {
			d := p.byID(id)
			if d == nil {
				return nil, fmt.Errorf("invalid allocation request for '%s': unknown device: %s", resourceName, id)
			}
			if seen[id] {
				continue
			}
			seen[id] = true
			if p.idStrategy == "index" {
				visible = append(visible, strconv.Itoa(d.index))
			} else {
				visible = append(visible, d.ID)
			}
		}
		response.ContainerResponses = append(response.ContainerResponses, &pluginapi.ContainerAllocateResponse{
			Envs: map[string]string{deviceListEnvVar: strings.Join(visible, ",")},
		})
	}
	return response, nil
}

func (p *devicePlugin) GetPreferredAllocation(_ context.Context, request *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	response := &pluginapi.PreferredAllocationResponse{}
	for _, container := range request.ContainerRequests {
		ids, err := p.preferredAllocation(container.AvailableDeviceIDs, container.MustIncludeDeviceIDs,
			int(container.AllocationSize))
		if err != nil {
			return nil, fmt.Errorf("error getting list of preferred allocation devices: %v", err)
		}
		response.ContainerResponses = append(response.ContainerResponses,
			&pluginapi.ContainerPreferredAllocationResponse{DeviceIDs: ids})
	}
	return response, nil
}

func (p *devicePlugin) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}
