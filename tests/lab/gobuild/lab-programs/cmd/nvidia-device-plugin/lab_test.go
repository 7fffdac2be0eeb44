package main

// Test scaffolding: the node's simulated GPUs made and broken by the lab's real fault CLI (fake-nvml, run with
// python3), and a kubelet's registration service on kubelet.sock.

import (
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

const driverVersion = "535.183.06"

// node: a scratch node with 4 simulated A100 PCIe GPUs (0-1 and 2-3 joined by NVLink bridges).
type node struct {
	t    *testing.T
	dir  string // the kubelet's device-plugin directory
	nvml fakeNVML
}

func fakeNVMLCtl(t *testing.T) string {
	_, here, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(here), "..", "..", "..", "..", "fake_nvml", "fake_nvml_ctl.py")
}

func newNode(t *testing.T) *node {
	t.Helper()
	// short: a unix socket path has at most 107 bytes
	dir, err := os.MkdirTemp("", "dp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	for _, sub := range []string{"device-plugins", "nvml", "lib"} {
		if err := os.Mkdir(filepath.Join(dir, sub), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	n := &node{t: t, dir: filepath.Join(dir, "device-plugins"), nvml: fakeNVML{
		statePath: filepath.Join(dir, "nvml", "state.json"), libraryPath: filepath.Join(dir, "lib", "libnvidia-ml.so.1"),
	}}
	n.writeLibrary(driverVersion)
	return n
}

func (n *node) writeLibrary(version string) {
	if err := os.WriteFile(n.nvml.libraryPath, []byte("version="+version+"\n"), 0o644); err != nil {
		n.t.Fatal(err)
	}
}

// fakeNVML runs `fake-nvml ARGS` against this node's state.
func (n *node) fakeNVML(args ...string) {
	n.t.Helper()
	cmd := exec.Command("python3", append([]string{fakeNVMLCtl(n.t)}, args...)...)
	cmd.Env = append(os.Environ(), stateEnv+"="+n.nvml.statePath, libraryEnv+"="+n.nvml.libraryPath)
	out, err := cmd.CombinedOutput()
	if err != nil {
		n.t.Fatalf("fake-nvml %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

func (n *node) initGPUs() {
	n.fakeNVML("init", "--shape", "a100-pcie-40gb-x4", "--host", "gpu-node-test")
}

func (n *node) state() *nvmlState {
	n.t.Helper()
	state, err := n.nvml.readState()
	if err != nil {
		n.t.Fatal(err)
	}
	return state
}

func (n *node) uuids() []string {
	var ids []string
	for _, gpu := range n.state().enumerated() {
		ids = append(ids, gpu.UUID)
	}
	return ids
}

func (n *node) config() config {
	return config{
		dir: n.dir, nvml: n.nvml, filter: xidFilterFromEnv(), failOnInitError: true, idStrategy: "uuid",
		pollInterval: 20 * time.Millisecond, retryInterval: 100 * time.Millisecond,
	}
}

// kubelet: the registration service of a kubelet, on DIR/kubelet.sock.
type kubelet struct {
	pluginapi.UnimplementedRegistrationServer
	server   *grpc.Server
	requests chan *pluginapi.RegisterRequest
	refuse   int // registrations to refuse first
}

func (k *kubelet) Register(_ context.Context, request *pluginapi.RegisterRequest) (*pluginapi.Empty, error) {
	k.requests <- request
	if k.refuse > 0 {
		k.refuse--
		return nil, errors.New("the kubelet refuses the registration")
	}
	return &pluginapi.Empty{}, nil
}

func startKubelet(t *testing.T, dir string) *kubelet {
	t.Helper()
	path := filepath.Join(dir, kubeletSocketName)
	_ = os.Remove(path) // a starting kubelet replaces its socket: the plugin sees it created
	listener, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	k := &kubelet{server: grpc.NewServer(), requests: make(chan *pluginapi.RegisterRequest, 8)}
	pluginapi.RegisterRegistrationServer(k.server, k)
	go k.server.Serve(listener) //nolint:errcheck // stopped by the test
	t.Cleanup(k.server.Stop)
	return k
}

func (k *kubelet) registration(t *testing.T) *pluginapi.RegisterRequest {
	t.Helper()
	select {
	case request := <-k.requests:
		return request
	case <-time.After(10 * time.Second):
		t.Fatal("the plugin did not register with the kubelet")
		return nil
	}
}

func (k *kubelet) noRegistration(t *testing.T, wait time.Duration) {
	t.Helper()
	select {
	case request := <-k.requests:
		t.Fatalf("unexpected registration %v", request)
	case <-time.After(wait):
	}
}

// runPlugin runs the plugin's main loop until the test ends; its error (if it stops) arrives on the channel.
func runPlugin(t *testing.T, cfg config) (chan<- os.Signal, <-chan error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	signals := make(chan os.Signal, 1)
	stopped := make(chan error, 1)
	done := make(chan struct{})
	go func() {
		stopped <- run(ctx, cfg, signals)
		close(done)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("the plugin did not stop")
		}
	})
	return signals, stopped
}

// pluginClient connects to the plugin's socket as the kubelet does.
func pluginClient(t *testing.T, dir string) pluginapi.DevicePluginClient {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+filepath.Join(dir, socketName),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return pluginapi.NewDevicePluginClient(conn)
}

// watch opens ListAndWatch; next() returns the next list as ID -> health.
func watch(t *testing.T, client pluginapi.DevicePluginClient) func() map[string]string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	stream, err := client.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	return func() map[string]string {
		t.Helper()
		received := make(chan *pluginapi.ListAndWatchResponse, 1)
		failed := make(chan error, 1)
		go func() {
			response, err := stream.Recv()
			if err != nil {
				failed <- err
				return
			}
			received <- response
		}()
		select {
		case response := <-received:
			health := map[string]string{}
			for _, d := range response.Devices {
				health[d.ID] = d.Health
			}
			return health
		case err := <-failed:
			t.Fatalf("ListAndWatch: %v", err)
		case <-time.After(10 * time.Second):
			t.Fatal("ListAndWatch sent nothing")
		}
		return nil
	}
}

func quietLogs(t *testing.T) {
	t.Helper()
	logOutput = testLog{t}
	t.Cleanup(func() { logOutput = os.Stderr })
}

type testLog struct{ t *testing.T }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
