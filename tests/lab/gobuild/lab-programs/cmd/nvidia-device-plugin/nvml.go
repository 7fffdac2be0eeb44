package main

// The node's simulated NVML, read the way the lab's fake pynvml reads it (tests/lab/fake_nvml/pynvml.py): the
// "library" is the file $FAKE_NVML_LIBRARY (its version= line is the user-space driver version), the kernel side
// is the JSON state file $FAKE_NVML_STATE written by fake-nvml (tests/lab/fake_nvml/fake_nvml_ctl.py). In a pod,
// the lab's nvidia-container-runtime injects both, as the real runtime injects the driver.

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
)

const (
	stateEnv       = "FAKE_NVML_STATE"
	libraryEnv     = "FAKE_NVML_LIBRARY"
	defaultState   = "/var/lib/fake-nvml/state.json"
	defaultLibrary = "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"
	stateSchema    = 1
	archAmpere     = 7 // NVML_DEVICE_ARCH_AMPERE
)

// nvmlError is an NVML return code, printed as nvmlErrorString prints it.
type nvmlError string

func (e nvmlError) Error() string { return string(e) }

const (
	errDriverNotLoaded = nvmlError("Driver Not Loaded")
	errVersionMismatch = nvmlError("RM has detected an NVML/RM version mismatch.")
	errUnknown         = nvmlError("Unknown Error")
	errGPUIsLost       = nvmlError("GPU is lost")
)

// errNoLibrary: go-nvlib's platform detection finds no NVML library (no driver injected into the container).
var errNoLibrary = errors.New("no NVML library")

type pciInfo struct {
	Domain int `json:"domain"`
	Bus    int `json:"bus"`
	Device int `json:"device"`
}

func (p pciInfo) busID() string {
	return fmt.Sprintf("%08X:%02X:%02X.0", p.Domain, p.Bus, p.Device)
}

type eccCounts struct {
	Corrected   int64 `json:"corrected"`
	Uncorrected int64 `json:"uncorrected"`
}

type remappedRows struct {
	Correctable   int64 `json:"correctable"`
	Uncorrectable int64 `json:"uncorrectable"`
	Pending       int64 `json:"pending"`
	Failure       int64 `json:"failure"`
}

type nvlink struct {
	Link       int    `json:"link"`
	Active     bool   `json:"active"`
	RemoteType string `json:"remote_type"`
	RemoteSlot *int   `json:"remote_slot"`
}

type gpuState struct {
	Slot         int     `json:"slot"`
	Present      *bool   `json:"present"` // absent: present, as the fake pynvml reads it
	Lost         bool    `json:"lost"`
	Name         string  `json:"name"`
	UUID         string  `json:"uuid"`
	MinorNumber  int     `json:"minor_number"`
	Architecture int     `json:"architecture"`
	PCI          pciInfo `json:"pci"`
	ECC          struct {
		Volatile eccCounts `json:"volatile"`
	} `json:"ecc"`
	RemappedRows *remappedRows `json:"remapped_rows"` // null: the GPU does not remap rows
	NVLinks      []nvlink      `json:"nvlinks"`
}

func (g *gpuState) present() bool { return g.Present == nil || *g.Present }

type nvmlState struct {
	Schema              int        `json:"schema"`
	KernelModuleVersion string     `json:"kernel_module_version"`
	PCIeTopology        [][]int    `json:"pcie_topology"` // NVML topology levels, indexed by slot
	GPUs                []gpuState `json:"gpus"`
}

// enumerated: the GPUs the driver enumerates, in NVML index order (a removed GPU is off the bus).
func (s *nvmlState) enumerated() []*gpuState {
	var gpus []*gpuState
	for i := range s.GPUs {
		if s.GPUs[i].present() {
			gpus = append(gpus, &s.GPUs[i])
		}
	}
	sort.Slice(gpus, func(a, b int) bool { return gpus[a].Slot < gpus[b].Slot })
	return gpus
}

func (s *nvmlState) bySlot(slot int) *gpuState {
	for i := range s.GPUs {
		if s.GPUs[i].Slot == slot {
			return &s.GPUs[i]
		}
	}
	return nil
}

// fakeNVML locates the simulated library and state.
type fakeNVML struct {
	libraryPath string
	statePath   string
}

func fakeNVMLFromEnv() fakeNVML {
	n := fakeNVML{libraryPath: os.Getenv(libraryEnv), statePath: os.Getenv(stateEnv)}
	if n.libraryPath == "" {
		n.libraryPath = defaultLibrary
	}
	if n.statePath == "" {
		n.statePath = defaultState
	}
	return n
}

// libraryVersion: the user-space driver version ("" without a version line); errNoLibrary without the library.
func (n fakeNVML) libraryVersion() (string, error) {
	f, err := os.Open(n.libraryPath)
	if err != nil {
		return "", fmt.Errorf("%w: %v", errNoLibrary, err)
	}
	defer f.Close()
	lines := bufio.NewScanner(f)
	for lines.Scan() {
		key, value, found := strings.Cut(lines.Text(), "=")
		if found && strings.TrimSpace(key) == "version" {
			return strings.TrimSpace(value), nil
		}
	}
	return "", nil
}

// readState: the kernel side. No file: the kernel module is not loaded.
func (n fakeNVML) readState() (*nvmlState, error) {
	data, err := os.ReadFile(n.statePath)
	if errors.Is(err, os.ErrNotExist) {
		return nil, errDriverNotLoaded
	}
	if err != nil {
		return nil, errUnknown
	}
	var state nvmlState
	if json.Unmarshal(data, &state) != nil || state.Schema != stateSchema {
		return nil, errUnknown
	}
	return &state, nil
}

// initialize is nvmlInit: the library must exist, the driver be loaded and of the library's version.
func (n fakeNVML) initialize() (*nvmlState, error) {
	version, err := n.libraryVersion()
	if err != nil {
		return nil, err
	}
	state, err := n.readState()
	if err != nil {
		return nil, err
	}
	if state.KernelModuleVersion != version {
		return nil, errVersionMismatch
	}
	holdControlDevice()
	return state, nil
}

// controlDevice is the driver's /dev/nvidiactl ($FAKE_NVML_CONTROL_DEVICE), which NVML opens at its first init
// and holds for the process's life: so the plugin shows up holding it, as NVIDIA's does, and driver work must stop
// it before the module can be unloaded. Absent (no driver, a unit test), nothing is held.
var controlDevice *os.File

func holdControlDevice() {
	if controlDevice != nil {
		return
	}
	path := os.Getenv("FAKE_NVML_CONTROL_DEVICE")
	if path == "" {
		path = "/dev/nvidiactl"
	}
	if device, err := os.Open(path); err == nil {
		controlDevice = device
	}
}
