// Command calico-standin stands in for the programs of Calico v3.32.1's images, whose Go module this machine's Go
// proxy does not serve and whose BGP daemon (BIRD) is C. The lab applies Calico's manifest unchanged; its pods run
// these programs, and the pod network and NetworkPolicy are kube-router's (real, built from its Go module). One
// binary, dispatched on the name it is called by (a link per program in the images), or on its first argument:
//
//	calico-node           (quay.io/calico/node entrypoint) exec kube-router: pod routes by iBGP, NetworkPolicy
//	calico-node -felix-live|-felix-ready|-bird-live|-bird-ready   0 when kube-router's /healthz answers 200
//	calico-node -init [-best-effort], -shutdown                   0: no eBPF data plane to mount or stop
//	calico-ipam -upgrade  (quay.io/calico/cni)      0: no host-local to calico-ipam upgrade (IPAM stays host-local)
//	install               (quay.io/calico/cni)      write the CNI conflist kube-router fills in
//	kube-controllers      (quay.io/calico/kube-controllers entrypoint) idle: no Calico datastore to reconcile
//	check-status -l|-r    (quay.io/calico/kube-controllers) 0
//
// What it refuses: an unknown program or flag, a datastore other than Kubernetes, calico-ipam or calico-node
// asked for anything the manifest does not ask of them.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
)

const calicoVersion = "v3.32.1"

// system: what the programs touch outside themselves (the real process's in main).
type system struct {
	getenv  func(string) string
	environ []string
	stdout  io.Writer
	stderr  io.Writer
	exec    func(path string, argv []string, env []string) error
	wait    func() // until the pod is stopped
	hostCNI string // the host's /etc/cni/net.d as the pod mounts it
	health  string // kube-router's health URL
}

type program func(sys system, args []string) int

var programs = map[string]program{
	"calico-node":      calicoNode,
	"calico-ipam":      calicoIPAM,
	"install":          installCNI,
	"kube-controllers": kubeControllers,
	"check-status":     checkStatus,
}

func programNames() string {
	var names []string
	for name := range programs {
		names = append(names, name)
	}
	sort.Strings(names)
	return strings.Join(names, ", ")
}

// dispatch runs the program ARGV[0] names, or the one ARGV[1] names; the exit status.
func dispatch(sys system, argv []string) int {
	if run, ok := programs[filepath.Base(argv[0])]; ok {
		return run(sys, argv[1:])
	}
	if len(argv) > 1 {
		if run, ok := programs[argv[1]]; ok {
			return run(sys, argv[2:])
		}
	}
	fmt.Fprintf(sys.stderr, "calico-standin: call it as one of %s (by name or as its first argument)\n",
		programNames())
	return 2
}

// flags: a flag set that reports errors as the Go flag package does, on stderr.
func flags(sys system, name string) *flag.FlagSet {
	set := flag.NewFlagSet(name, flag.ContinueOnError)
	set.SetOutput(sys.stderr)
	return set
}

// parse: 0 to go on, else the exit status (2 for a bad flag or an argument, as the flag package exits).
func parse(sys system, set *flag.FlagSet, args []string) int {
	if err := set.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return 1
		}
		return 2
	}
	if set.NArg() > 0 {
		fmt.Fprintf(sys.stderr, "%s: unexpected arguments %v\n", set.Name(), set.Args())
		return 2
	}
	return 0
}

// kubernetesDatastore: only the Kubernetes API datastore (DATASTORE_TYPE=kubernetes, as calico.yaml sets) is stood in.
func kubernetesDatastore(sys system, name string) bool {
	if datastore := sys.getenv("DATASTORE_TYPE"); datastore != "" && datastore != "kubernetes" {
		fmt.Fprintf(sys.stderr, "%s: DATASTORE_TYPE=%s: the lab stands in for the kubernetes datastore only\n",
			name, datastore)
		return false
	}
	return true
}

func calicoIPAM(sys system, args []string) int {
	set := flags(sys, "calico-ipam")
	upgrade := set.Bool("upgrade", false, "upgrade from host-local IPAM")
	version := set.Bool("v", false, "print the version")
	if status := parse(sys, set, args); status != 0 {
		return status
	}
	switch {
	case *version:
		fmt.Fprintln(sys.stdout, calicoVersion)
		return 0
	case *upgrade:
		fmt.Fprintln(sys.stderr, "calico-ipam: nothing to upgrade: the lab's pod IPAM is host-local, "+
			"on the node's podCIDR (kube-router)")
		return 0
	}
	fmt.Fprintln(sys.stderr, "calico-ipam: only -upgrade is stood in: the lab's CNI conflist uses host-local, "+
		"never calico-ipam")
	return 1
}

func kubeControllers(sys system, args []string) int {
	if status := parse(sys, flags(sys, "kube-controllers"), args); status != 0 {
		return status
	}
	if !kubernetesDatastore(sys, "kube-controllers") {
		return 1
	}
	fmt.Fprintf(sys.stderr, "kube-controllers: ENABLED_CONTROLLERS=%s: no Calico datastore in the lab "+
		"(kube-router is the data plane): nothing to reconcile; waiting to be stopped\n", sys.getenv("ENABLED_CONTROLLERS"))
	sys.wait()
	return 0
}

func checkStatus(sys system, args []string) int {
	set := flags(sys, "check-status")
	live := set.Bool("l", false, "liveness")
	ready := set.Bool("r", false, "readiness")
	if status := parse(sys, set, args); status != 0 {
		return status
	}
	if !*live && !*ready {
		fmt.Fprintln(sys.stderr, "check-status: give -l (liveness) or -r (readiness)")
		return 2
	}
	return 0
}

func main() {
	sys := system{
		getenv: os.Getenv, environ: os.Environ(), stdout: os.Stdout, stderr: os.Stderr,
		exec: syscall.Exec, wait: waitForSignal, hostCNI: hostCNIDir, health: kubeRouterHealthURL,
	}
	os.Exit(dispatch(sys, os.Args))
}

func waitForSignal() {
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	<-signals
}
