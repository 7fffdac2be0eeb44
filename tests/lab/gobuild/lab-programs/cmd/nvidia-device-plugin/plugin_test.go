package main

import (
	"context"
	"strings"
	"syscall"
	"testing"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

func TestRegistersAndListsTheNodesGPUs(t *testing.T) {
	quietLogs(t)
	n := newNode(t)
	n.initGPUs()
	k := startKubelet(t, n.dir)
	runPlugin(t, n.config())

	request := k.registration(t)
	if request.Version != "v1beta1" || request.Endpoint != "nvidia-gpu.sock" || request.ResourceName != "nvidia.com/gpu" ||
		!request.Options.GetGetPreferredAllocationAvailable() || request.Options.GetPreStartRequired() {
		t.Fatalf("registration %v", request)
	}
	client := pluginClient(t, n.dir)
	options, err := client.GetDevicePluginOptions(context.Background(), &pluginapi.Empty{})
	if err != nil || !options.GetPreferredAllocationAvailable || options.PreStartRequired {
		t.Fatalf("options %v, %v", options, err)
	}
	health := watch(t, client)()
	if len(health) != 4 {
		t.Fatalf("want the 4 GPUs, got %v", health)
	}
	for _, id := range n.uuids() {
		if health[id] != pluginapi.Healthy {
			t.Fatalf("%s: %q in %v", id, health[id], health)
		}
	}
	if _, err := client.PreStartContainer(context.Background(), &pluginapi.PreStartContainerRequest{}); err != nil {
		t.Fatal(err)
	}
}

func TestALostGPUStaysUnhealthyUntilTheKubeletRestarts(t *testing.T) {
	quietLogs(t)
	n := newNode(t)
	n.initGPUs()
	ids := n.uuids()
	k := startKubelet(t, n.dir)
	runPlugin(t, n.config())
	k.registration(t)
	next := watch(t, pluginClient(t, n.dir))
	next()

	n.fakeNVML("gpu", "--gpu", "3", "--lost")
	health := next()
	if health[ids[3]] != pluginapi.Unhealthy || health[ids[0]] != pluginapi.Healthy || len(health) != 4 {
		t.Fatalf("GPU 3 lost: %v", health)
	}
	// As NVIDIA's plugin: no way back to Healthy while it runs.
	n.fakeNVML("gpu", "--gpu", "3", "--restore")
	time.Sleep(200 * time.Millisecond)
	n.fakeNVML("ecc", "--gpu", "1", "--uncorrectable", "1")
	if health := next(); health[ids[3]] != pluginapi.Unhealthy || health[ids[1]] != pluginapi.Unhealthy {
		t.Fatalf("GPU 3 restored, then GPU 1 ECC error: %v", health)
	}

	// The kubelet restarts (kubelet.sock created anew): the plugin registers again with its GPUs as found now.
	k = startKubelet(t, n.dir)
	k.registration(t)
	health = watch(t, pluginClient(t, n.dir))()
	for _, id := range ids {
		if health[id] != pluginapi.Healthy {
			t.Fatalf("after the kubelet's restart: %v", health)
		}
	}
}

func TestSIGHUPRestartsWithTheGPUsEnumeratedAgain(t *testing.T) {
	quietLogs(t)
	n := newNode(t)
	n.initGPUs()
	ids := n.uuids()
	k := startKubelet(t, n.dir)
	signals, _ := runPlugin(t, n.config())
	k.registration(t)
	next := watch(t, pluginClient(t, n.dir))
	next()

	n.fakeNVML("gpu", "--gpu", "2", "--remove")
	if health := next(); health[ids[2]] != pluginapi.Unhealthy || len(health) != 4 {
		t.Fatalf("GPU 2 removed: %v", health)
	}
	signals <- syscall.SIGHUP
	k.registration(t)
	health := watch(t, pluginClient(t, n.dir))()
	if _, listed := health[ids[2]]; listed || len(health) != 3 {
		t.Fatalf("after SIGHUP the removed GPU is no longer enumerated: %v", health)
	}
}

func TestFailsToStartWithoutTheDriver(t *testing.T) {
	quietLogs(t)
	n := newNode(t)
	k := startKubelet(t, n.dir)
	_, stopped := runPlugin(t, n.config())
	select {
	case err := <-stopped:
		if err == nil || !strings.Contains(err.Error(), "nvml init failed: Driver Not Loaded") {
			t.Fatalf("error %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the plugin started without an NVML state")
	}
	k.noRegistration(t, 0)
}

func TestWaitsWithoutTheDriverWhenFailOnInitErrorIsFalse(t *testing.T) {
	quietLogs(t)
	n := newNode(t)
	k := startKubelet(t, n.dir)
	cfg := n.config()
	cfg.failOnInitError = false
	_, stopped := runPlugin(t, cfg)
	k.noRegistration(t, 500*time.Millisecond)
	select {
	case err := <-stopped:
		t.Fatalf("the plugin stopped: %v", err)
	default:
	}
	// It waits indefinitely: the driver appearing is not enough, a restart (here the kubelet's) is.
	n.initGPUs()
	k.noRegistration(t, 300*time.Millisecond)
	k = startKubelet(t, n.dir)
	k.registration(t)
}

func TestRefusesToStartOnAnNVMLError(t *testing.T) {
	for name, tc := range map[string]struct {
		prepare func(n *node)
		want    string
	}{
		"no library": {
			func(n *node) { n.initGPUs(); n.nvml.libraryPath += ".absent" }, "platform detection failed"},
		"driver/library mismatch": {
			func(n *node) { n.initGPUs(); n.fakeNVML("kernel-version", "550.54.15") },
			"nvml init failed: RM has detected an NVML/RM version mismatch."},
		"a GPU lost before the start": {
			func(n *node) { n.initGPUs(); n.fakeNVML("gpu", "--gpu", "1", "--lost") },
			"error getting device handle for index '1': GPU is lost"},
	} {
		t.Run(name, func(t *testing.T) {
			quietLogs(t)
			n := newNode(t)
			tc.prepare(n)
			startKubelet(t, n.dir)
			_, stopped := runPlugin(t, n.config())
			select {
			case err := <-stopped:
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("error %v, want %q", err, tc.want)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the plugin started")
			}
		})
	}
}

func TestRetriesAFailedRegistration(t *testing.T) {
	quietLogs(t)
	n := newNode(t)
	n.initGPUs()
	k := startKubelet(t, n.dir)
	k.refuse = 1
	runPlugin(t, n.config())
	k.registration(t) // refused
	k.registration(t) // the retry, with no new kubelet.sock
}

func TestAllocatePassesTheGPUsByEnvvar(t *testing.T) {
	quietLogs(t)
	n := newNode(t)
	n.initGPUs()
	ids := n.uuids()
	k := startKubelet(t, n.dir)
	cfg := n.config()
	runPlugin(t, cfg)
	k.registration(t)
	client := pluginClient(t, n.dir)

	response, err := client.Allocate(context.Background(), &pluginapi.AllocateRequest{
		ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{ids[2], ids[0]}}, {DevicesIds: []string{ids[1]}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{ids[2] + "," + ids[0], ids[1]}
	for i, container := range response.ContainerResponses {
		if len(container.Envs) != 1 || container.Envs["NVIDIA_VISIBLE_DEVICES"] != want[i] ||
			len(container.Mounts) != 0 || len(container.Devices) != 0 || len(container.Annotations) != 0 {
			t.Fatalf("container %d: %v", i, container)
		}
	}
	_, err = client.Allocate(context.Background(), &pluginapi.AllocateRequest{
		ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"GPU-not-here"}}},
	})
	if err == nil || !strings.Contains(err.Error(), "invalid allocation request for 'nvidia.com/gpu': unknown device: GPU-not-here") {
		t.Fatalf("unknown device: %v", err)
	}
}

func TestAllocateByIndex(t *testing.T) {
	n := newNode(t)
	n.initGPUs()
	devices, err := enumerate(n.state())
	if err != nil {
		t.Fatal(err)
	}
	cfg := n.config()
	cfg.idStrategy = "index"
	p := newDevicePlugin(cfg, n.state(), devices)
	response, err := p.Allocate(context.Background(), &pluginapi.AllocateRequest{
		ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{devices[3].ID, devices[1].ID}}},
	})
	if err != nil || response.ContainerResponses[0].Envs["NVIDIA_VISIBLE_DEVICES"] != "3,1" {
		t.Fatalf("%v, %v", response, err)
	}
}
