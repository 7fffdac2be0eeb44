package main

// install: the CNI conflist of the lab's pod network, in the shape kube-router's own manifests use: a bridge
// (kube-bridge, the pods' default gateway) with host-local IPAM, whose range kube-router fills in from the node's
// podCIDR when it starts, and portmap for hostPorts. The standard plugins come from the node's kubernetes-cni
// package; nothing is copied to /opt/cni/bin and no Calico kubeconfig is written.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
)

const (
	hostCNIDir         = "/host/etc/cni/net.d" // the host's /etc/cni/net.d, as calico.yaml mounts it
	defaultCNIConfName = "10-calico.conflist"  // calico.yaml's CNI_CONF_NAME
	networkName        = "k8s-pod-network"     // the network's name in calico.yaml
	cniVersion         = "0.3.1"
	bridgeName         = "kube-bridge" // kube-router's bridge
)

func cniConfName(sys system) string {
	if name := sys.getenv("CNI_CONF_NAME"); name != "" {
		return name
	}
	return defaultCNIConfName
}

type ipamConfig struct {
	Type   string          `json:"type"`
	Ranges json.RawMessage `json:"ranges,omitempty"` // kube-router's: kept across a reinstall
}

type bridgeConfig struct {
	Name             string          `json:"name"`
	Type             string          `json:"type"`
	Bridge           string          `json:"bridge"`
	IsDefaultGateway bool            `json:"isDefaultGateway"`
	MTU              json.RawMessage `json:"mtu,omitempty"` // kube-router's (auto-mtu): kept across a reinstall
	IPAM             ipamConfig      `json:"ipam"`
}

type portmapConfig struct {
	Type         string          `json:"type"`
	SNAT         bool            `json:"snat"`
	Capabilities map[string]bool `json:"capabilities"`
}

type conflist struct {
	CNIVersion string `json:"cniVersion"`
	Name       string `json:"name"`
	Plugins    []any  `json:"plugins"`
}

// renderConflist: the conflist, keeping the range and MTU kube-router wrote into PREVIOUS (a reinstall, at each
// restart of the calico-node pod, must not take the node's pod range away until kube-router writes it again).
func renderConflist(previous []byte) ([]byte, error) {
	bridge := bridgeConfig{
		Name: "kubernetes", Type: "bridge", Bridge: bridgeName, IsDefaultGateway: true,
		IPAM: ipamConfig{Type: "host-local"},
	}
	var old struct {
		Plugins []struct {
			Type string          `json:"type"`
			MTU  json.RawMessage `json:"mtu"`
			IPAM struct {
				Ranges json.RawMessage `json:"ranges"`
			} `json:"ipam"`
		} `json:"plugins"`
	}
	if json.Unmarshal(previous, &old) == nil {
		for _, plugin := range old.Plugins {
			if plugin.Type == "bridge" {
				bridge.MTU, bridge.IPAM.Ranges = plugin.MTU, plugin.IPAM.Ranges
			}
		}
	}
	portmap := portmapConfig{Type: "portmap", SNAT: true, Capabilities: map[string]bool{"portMappings": true}}
	return json.MarshalIndent(conflist{CNIVersion: cniVersion, Name: networkName, Plugins: []any{bridge, portmap}},
		"", "  ")
}

func sameJSON(a, b []byte) bool {
	var x, y any
	return json.Unmarshal(a, &x) == nil && json.Unmarshal(b, &y) == nil && reflect.DeepEqual(x, y)
}

// writeConflist writes DIR/NAME atomically (the runtime watches the directory); false when it was already so.
func writeConflist(dir, name string) (bool, error) {
	path := filepath.Join(dir, name)
	previous, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		return false, err
	}
	data, err := renderConflist(previous)
	if err != nil {
		return false, err
	}
	data = append(data, '\n')
	if sameJSON(previous, data) {
		return false, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return false, err
	}
	tmp, err := os.CreateTemp(dir, "."+name+".")
	if err != nil {
		return false, err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return false, err
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return false, err
	}
	if err := tmp.Close(); err != nil {
		return false, err
	}
	return true, os.Rename(tmp.Name(), path)
}

func installCNI(sys system, args []string) int {
	if status := parse(sys, flags(sys, "install"), args); status != 0 {
		return status
	}
	name := cniConfName(sys)
	if name != filepath.Base(name) || !bytes.HasSuffix([]byte(name), []byte(".conflist")) {
		fmt.Fprintf(sys.stderr, "install: CNI_CONF_NAME=%s: want a file name ending in .conflist\n", name)
		return 1
	}
	written, err := writeConflist(sys.hostCNI, name)
	if err != nil {
		fmt.Fprintf(sys.stderr, "install: %v\n", err)
		return 1
	}
	state := "unchanged"
	if written {
		state = "written"
	}
	fmt.Fprintf(sys.stderr, "install: CNI config %s %s (bridge %s, host-local IPAM filled in by kube-router, "+
		"portmap)\n", filepath.Join(sys.hostCNI, name), state, bridgeName)
	// As Calico's installer: without SLEEP=false it stays, for use as a long-running container.
	if sys.getenv("SLEEP") != "false" {
		sys.wait()
	}
	return 0
}
