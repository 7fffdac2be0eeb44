package main

// calico-node: the pod's main process is kube-router v2.1.0 as the pod network and NetworkPolicy controller (its
// service proxy stays off: kube-proxy is real); the probes ask kube-router's health endpoint.

import (
	"fmt"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

const (
	kubeRouterPath       = "/usr/local/bin/kube-router"
	kubeRouterHealthPort = 20244           // kube-router's default, passed explicitly: the probes read the same constant
	probeTimeout         = 5 * time.Second // under calico.yaml's probe timeoutSeconds (10)
)

var kubeRouterHealthURL = "http://127.0.0.1:" + strconv.Itoa(kubeRouterHealthPort) + "/healthz"

func calicoNode(sys system, args []string) int {
	set := flags(sys, "calico-node")
	var probes [6]bool
	for i, name := range []string{"felix-live", "felix-ready", "bird-live", "bird-ready", "bird6-live", "bird6-ready"} {
		set.BoolVar(&probes[i], name, false, "report "+name+" (kube-router's health)")
	}
	initialise := set.Bool("init", false, "mount the eBPF file systems")
	set.Bool("best-effort", false, "with -init: do not fail (there is nothing to fail)")
	shutdown := set.Bool("shutdown", false, "the preStop hook")
	version := set.Bool("v", false, "print the version")
	if status := parse(sys, set, args); status != 0 {
		return status
	}
	live := probes[0] || probes[2] || probes[4]
	ready := probes[1] || probes[3] || probes[5]
	switch {
	case *version:
		fmt.Fprintln(sys.stdout, calicoVersion)
		return 0
	case *initialise:
		fmt.Fprintln(sys.stderr, "calico-node -init: nothing to mount: the lab has no eBPF data plane")
		return 0
	case *shutdown:
		return 0
	case live || ready:
		return probe(sys, ready)
	}
	return startKubeRouter(sys)
}

// kubeRouterCommand: kube-router's command line and environment for this node.
func kubeRouterCommand(sys system) ([]string, []string, error) {
	node := sys.getenv("NODENAME")
	if node == "" {
		return nil, nil, fmt.Errorf("NODENAME is not set (calico.yaml sets it from spec.nodeName)")
	}
	argv := []string{
		kubeRouterPath,
		"--run-router=true",
		"--run-firewall=true",
		"--run-service-proxy=false",
		"--enable-cni=true",
		"--hostname-override=" + node,
		"--health-port=" + strconv.Itoa(kubeRouterHealthPort),
	}
	set := []string{
		"NODE_NAME=" + node, // kube-router finds its Node by NODE_NAME first
		// v2.1.0 reads the conflist to fill in from this variable (it has no flag for it)
		"KUBE_ROUTER_CNI_CONF_FILE=" + filepath.Join(sys.hostCNI, cniConfName(sys)),
	}
	var env []string
	for _, variable := range sys.environ {
		name, _, _ := strings.Cut(variable, "=")
		if name != "NODE_NAME" && name != "KUBE_ROUTER_CNI_CONF_FILE" { // the first of two would win
			env = append(env, variable)
		}
	}
	return argv, append(env, set...), nil
}

func startKubeRouter(sys system) int {
	if !kubernetesDatastore(sys, "calico-node") {
		return 1
	}
	argv, env, err := kubeRouterCommand(sys)
	if err != nil {
		fmt.Fprintf(sys.stderr, "calico-node: %v\n", err)
		return 1
	}
	fmt.Fprintf(sys.stderr, "calico-node: the lab's pod network and NetworkPolicy: exec %v\n", argv)
	err = sys.exec(argv[0], argv, env)
	fmt.Fprintf(sys.stderr, "calico-node: exec %s: %v\n", argv[0], err)
	return 1
}

// probe: 0 when kube-router's /healthz answers 200, else 1 with one line on stderr.
func probe(sys system, ready bool) int {
	what := "live"
	if ready {
		what = "ready"
	}
	client := http.Client{Timeout: probeTimeout}
	response, err := client.Get(sys.health)
	if err != nil {
		fmt.Fprintf(sys.stderr, "calico/node is not %s: kube-router health: %v\n", what, err)
		return 1
	}
	defer response.Body.Close()
	if response.StatusCode != http.StatusOK {
		fmt.Fprintf(sys.stderr, "calico/node is not %s: kube-router health %s answered %s\n", what, sys.health,
			response.Status)
		return 1
	}
	return 0
}
