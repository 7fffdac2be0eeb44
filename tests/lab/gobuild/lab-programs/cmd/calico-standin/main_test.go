package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
)

// fakeSystem: a pod's view, with the exec and the wait recorded instead of done.
type fakeSystem struct {
	env             map[string]string
	stdout, stderr  bytes.Buffer
	execed          []string
	execEnv         []string
	waited          bool
	hostCNI, health string
}

func (f *fakeSystem) system() system {
	return system{
		getenv:  func(name string) string { return f.env[name] },
		environ: []string{"PATH=/usr/bin", "NODE_NAME=stale"},
		stdout:  &f.stdout,
		stderr:  &f.stderr,
		exec: func(path string, argv []string, env []string) error {
			f.execed, f.execEnv = argv, env
			return errors.New("exec recorded")
		},
		wait:    func() { f.waited = true },
		hostCNI: f.hostCNI,
		health:  f.health,
	}
}

// calicoYAMLEnv: the environment calico.yaml gives the containers that matter here.
func calicoYAMLEnv() map[string]string {
	return map[string]string{
		"NODENAME": "gpu-node-2", "DATASTORE_TYPE": "kubernetes", "CNI_CONF_NAME": "10-calico.conflist",
		"SLEEP": "false", "ENABLED_CONTROLLERS": "node,loadbalancer",
	}
}

func TestDispatch(t *testing.T) {
	for _, tc := range []struct {
		argv   []string
		status int
		stderr string
	}{
		{[]string{"/opt/cni/bin/calico-ipam", "-upgrade"}, 0, "nothing to upgrade"},
		{[]string{"/opt/cni/bin/calico-ipam"}, 1, "only -upgrade is stood in"},
		{[]string{"calico-node", "-init", "-best-effort"}, 0, "nothing to mount"},
		{[]string{"/bin/calico-node", "-shutdown"}, 0, ""},
		{[]string{"/bin/calico-node", "-no-such-flag"}, 2, "flag provided but not defined: -no-such-flag"},
		{[]string{"/bin/calico-node", "extra"}, 2, "unexpected arguments"},
		{[]string{"/usr/bin/check-status", "-l"}, 0, ""},
		{[]string{"/usr/bin/check-status", "-r"}, 0, ""},
		{[]string{"/usr/bin/check-status"}, 2, "give -l (liveness) or -r (readiness)"},
		{[]string{"/usr/bin/calico-standin", "check-status", "-r"}, 0, ""},
		{[]string{"/usr/bin/calico-standin"}, 2, "call it as one of calico-ipam, calico-node, check-status, install, kube-controllers"},
		{[]string{"/usr/bin/felix"}, 2, "call it as one of"},
	} {
		t.Run(strings.Join(tc.argv, " "), func(t *testing.T) {
			f := &fakeSystem{env: calicoYAMLEnv(), hostCNI: t.TempDir()}
			if status := dispatch(f.system(), tc.argv); status != tc.status {
				t.Fatalf("status %d, want %d; stderr %s", status, tc.status, f.stderr.String())
			}
			if !strings.Contains(f.stderr.String(), tc.stderr) {
				t.Fatalf("stderr %q, want %q", f.stderr.String(), tc.stderr)
			}
		})
	}
}

func TestCalicoNodeExecsKubeRouter(t *testing.T) {
	f := &fakeSystem{env: calicoYAMLEnv(), hostCNI: "/host/etc/cni/net.d"}
	if status := dispatch(f.system(), []string{"/bin/calico-node"}); status != 1 {
		t.Fatalf("status %d (the recorded exec fails)", status)
	}
	want := []string{"/usr/local/bin/kube-router", "--run-router=true", "--run-firewall=true",
		"--run-service-proxy=false", "--enable-cni=true", "--hostname-override=gpu-node-2", "--health-port=20244"}
	if !reflect.DeepEqual(f.execed, want) {
		t.Fatalf("exec %v", f.execed)
	}
	wantEnv := []string{"PATH=/usr/bin", "NODE_NAME=gpu-node-2",
		"KUBE_ROUTER_CNI_CONF_FILE=/host/etc/cni/net.d/10-calico.conflist"}
	if !reflect.DeepEqual(f.execEnv, wantEnv) {
		t.Fatalf("environment %v, want %v", f.execEnv, wantEnv)
	}
}

func TestCalicoNodeRefuses(t *testing.T) {
	for name, env := range map[string]map[string]string{
		"no NODENAME": {"DATASTORE_TYPE": "kubernetes"},
		"etcd":        {"NODENAME": "n", "DATASTORE_TYPE": "etcdv3"},
	} {
		t.Run(name, func(t *testing.T) {
			f := &fakeSystem{env: env}
			if status := dispatch(f.system(), []string{"calico-node"}); status != 1 || f.execed != nil {
				t.Fatalf("status %d, exec %v", status, f.execed)
			}
		})
	}
}

func TestProbesAskKubeRoutersHealth(t *testing.T) {
	status := http.StatusOK
	server := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/healthz" {
			http.NotFound(w, r)
			return
		}
		w.WriteHeader(status)
	}))
	defer server.Close()
	probe := func(args ...string) (int, string) {
		f := &fakeSystem{env: calicoYAMLEnv(), health: server.URL + "/healthz"}
		code := dispatch(f.system(), append([]string{"/bin/calico-node"}, args...))
		return code, f.stderr.String()
	}
	for _, args := range [][]string{{"-felix-live", "-bird-live"}, {"-felix-ready", "-bird-ready"}, {"-bird-ready"}} {
		if code, stderr := probe(args...); code != 0 || stderr != "" {
			t.Fatalf("%v with /healthz 200: %d %q", args, code, stderr)
		}
	}
	status = http.StatusInternalServerError
	code, stderr := probe("-felix-ready", "-bird-ready")
	if code != 1 || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, "calico/node is not ready") {
		t.Fatalf("with /healthz 500: %d %q", code, stderr)
	}
	server.Close()
	code, stderr = probe("-felix-live", "-bird-live")
	if code != 1 || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, "calico/node is not live") {
		t.Fatalf("without kube-router: %d %q", code, stderr)
	}
}

func TestInstallWritesTheConflistKubeRouterFills(t *testing.T) {
	dir := t.TempDir()
	f := &fakeSystem{env: calicoYAMLEnv(), hostCNI: dir}
	if status := dispatch(f.system(), []string{"/opt/cni/bin/install"}); status != 0 || f.waited {
		t.Fatalf("status %d, waited %v: %s", status, f.waited, f.stderr.String())
	}
	path := filepath.Join(dir, "10-calico.conflist")
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Fatalf("want only the conflist in %s, got %v", dir, entries)
	}
	info, _ := os.Stat(path)
	if info.Mode().Perm() != 0o644 {
		t.Fatalf("mode %v", info.Mode())
	}
	// As containerd's CNI library reads it
	list, err := libcni.ConfListFromFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if list.Name != "k8s-pod-network" || list.CNIVersion != "0.3.1" || len(list.Plugins) != 2 ||
		list.Plugins[0].Network.Type != "bridge" || list.Plugins[0].Network.IPAM.Type != "host-local" ||
		list.Plugins[1].Network.Type != "portmap" {
		t.Fatalf("conflist %s", list.Bytes)
	}
	var bridge struct {
		Bridge           string `json:"bridge"`
		IsDefaultGateway bool   `json:"isDefaultGateway"`
	}
	var portmap struct {
		SNAT         bool            `json:"snat"`
		Capabilities map[string]bool `json:"capabilities"`
	}
	if json.Unmarshal(list.Plugins[0].Bytes, &bridge) != nil || bridge.Bridge != "kube-bridge" || !bridge.IsDefaultGateway ||
		json.Unmarshal(list.Plugins[1].Bytes, &portmap) != nil || !portmap.SNAT || !portmap.Capabilities["portMappings"] {
		t.Fatalf("plugins %s", list.Bytes)
	}

	// kube-router fills in the node's range (and MTU), rewriting the file its way; a reinstall keeps them.
	var filled map[string]any
	_ = json.Unmarshal(list.Bytes, &filled)
	plugin := filled["plugins"].([]any)[0].(map[string]any)
	plugin["mtu"] = 1450
	plugin["ipam"].(map[string]any)["ranges"] = []any{[]any{map[string]any{"subnet": "10.244.2.0/24"}}}
	data, _ := json.Marshal(filled)
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	before, _ := os.Stat(path)
	time.Sleep(10 * time.Millisecond)
	f = &fakeSystem{env: calicoYAMLEnv(), hostCNI: dir}
	if status := dispatch(f.system(), []string{"install"}); status != 0 || !strings.Contains(f.stderr.String(), "unchanged") {
		t.Fatalf("reinstall: %d %s", status, f.stderr.String())
	}
	after, _ := os.Stat(path)
	if !after.ModTime().Equal(before.ModTime()) {
		t.Fatal("an unchanged conflist was rewritten")
	}
	list, err = libcni.ConfListFromFile(path)
	if err != nil || !strings.Contains(string(list.Plugins[0].Bytes), "10.244.2.0/24") {
		t.Fatalf("range lost: %s %v", list.Bytes, err)
	}
}

func TestInstallSettings(t *testing.T) {
	dir := t.TempDir()
	env := calicoYAMLEnv()
	env["CNI_CONF_NAME"] = "05-lab.conflist"
	delete(env, "SLEEP")
	f := &fakeSystem{env: env, hostCNI: dir}
	if status := dispatch(f.system(), []string{"install"}); status != 0 || !f.waited {
		t.Fatalf("without SLEEP=false install stays: %d waited %v", status, f.waited)
	}
	if _, err := os.Stat(filepath.Join(dir, "05-lab.conflist")); err != nil {
		t.Fatal(err)
	}
	env["CNI_CONF_NAME"] = "../10-calico.conflist"
	f = &fakeSystem{env: env, hostCNI: dir}
	if status := dispatch(f.system(), []string{"install"}); status != 1 {
		t.Fatalf("a path as CNI_CONF_NAME: %d", status)
	}
}

func TestKubeControllersIdle(t *testing.T) {
	f := &fakeSystem{env: calicoYAMLEnv()}
	if status := dispatch(f.system(), []string{"/usr/bin/kube-controllers"}); status != 0 || !f.waited {
		t.Fatalf("status %d waited %v", status, f.waited)
	}
}
