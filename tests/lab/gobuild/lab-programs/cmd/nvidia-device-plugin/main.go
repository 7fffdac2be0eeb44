// Command nvidia-device-plugin is the lab's NVIDIA device plugin, shipped as nvcr.io/nvidia/k8s-device-plugin:v0.20.0
// so that NVIDIA's manifest applies unchanged. It speaks the kubelet's real device-plugin API (v1beta1): it serves
// nvidia.com/gpu on /var/lib/kubelet/device-plugins/nvidia-gpu.sock, registers on the kubelet's kubelet.sock and
// registers again when the kubelet restarts (kubelet.sock created anew) or on SIGHUP. What stands in for the
// hardware is where its GPUs come from: the node's simulated NVML (nvml.go), with health judged from the faults
// fake-nvml injects (health.go).
//
// Settings, as the real plugin reads them (flag, or its environment variable): --fail-on-init-error
// (FAIL_ON_INIT_ERROR, default true), --device-id-strategy (DEVICE_ID_STRATEGY: uuid or index),
// --device-list-strategy (DEVICE_LIST_STRATEGY: only envvar here), --mig-strategy (MIG_STRATEGY: none, single,
// mixed; the lab's GPUs have MIG disabled), DP_DISABLE_HEALTHCHECKS and DP_ENABLE_HEALTHCHECKS. Settings the lab
// cannot honour (CDI, volume-mounts, device specs, a config file, GDS, MOFED) are refused with a message.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

const (
	version        = "v0.20.0"
	healthPollTime = 2 * time.Second
	retryStartTime = 30 * time.Second // the real plugin's wait before it tries to register again
)

type config struct {
	dir             string
	nvml            fakeNVML
	filter          xidFilter
	failOnInitError bool
	idStrategy      string
	pollInterval    time.Duration
	retryInterval   time.Duration
}

var logOutput io.Writer = os.Stderr

// logf writes a klog-style line: Lmmdd hh:mm:ss.uuuuuu pid file:line] message.
func logf(level byte, format string, args ...any) {
	_, file, line, _ := runtime.Caller(1)
	now := time.Now()
	fmt.Fprintf(logOutput, "%c%s %7d %s:%d] %s\n", level, now.Format("0102 15:04:05.000000"), os.Getpid(),
		filepath.Base(file), line, fmt.Sprintf(format, args...))
}

// envBool reads a boolean setting from its flag's environment variable, refusing what strconv does not parse.
func envBool(name, flagName string, value *bool) error {
	text, ok := os.LookupEnv(name)
	if !ok || text == "" {
		return nil
	}
	parsed, err := strconv.ParseBool(text)
	if err != nil {
		return fmt.Errorf("could not parse %q as bool value from env %s for flag %s: %v", text, name, flagName, err)
	}
	*value = parsed
	return nil
}

func envString(name string, value *string) {
	if text := os.Getenv(name); text != "" {
		*value = text
	}
}

// parseConfig reads the settings from ARGS and the environment; an error names the setting.
func parseConfig(args []string) (config, bool, error) {
	cfg := config{
		dir: pluginapi.DevicePluginPath, nvml: fakeNVMLFromEnv(), failOnInitError: true, idStrategy: "uuid",
		pollInterval: healthPollTime, retryInterval: retryStartTime,
	}
	listStrategy, migStrategy, configFile := "envvar", "none", ""
	var passDeviceSpecs, gds, mofed bool
	errs := []error{
		envBool("FAIL_ON_INIT_ERROR", "fail-on-init-error", &cfg.failOnInitError),
		envBool("PASS_DEVICE_SPECS", "pass-device-specs", &passDeviceSpecs),
		envBool("GDS_ENABLED", "gds-enabled", &gds),
		envBool("MOFED_ENABLED", "mofed-enabled", &mofed),
	}
	if err := errors.Join(errs...); err != nil {
		return cfg, false, err
	}
	envString("DEVICE_ID_STRATEGY", &cfg.idStrategy)
	envString("DEVICE_LIST_STRATEGY", &listStrategy)
	envString("MIG_STRATEGY", &migStrategy)
	envString("CONFIG_FILE", &configFile)

	flags := flag.NewFlagSet("nvidia-device-plugin", flag.ContinueOnError)
	flags.SetOutput(logOutput)
	showVersion := flags.Bool("version", false, "print the version")
	flags.BoolVar(&cfg.failOnInitError, "fail-on-init-error", cfg.failOnInitError,
		"fail the plugin if an error is encountered during initialization, otherwise block indefinitely")
	flags.StringVar(&cfg.idStrategy, "device-id-strategy", cfg.idStrategy, "uuid or index")
	flags.StringVar(&listStrategy, "device-list-strategy", listStrategy, "envvar (the only one in the lab)")
	flags.StringVar(&migStrategy, "mig-strategy", migStrategy, "none, single or mixed")
	flags.BoolVar(&passDeviceSpecs, "pass-device-specs", passDeviceSpecs, "not in the lab")
	flags.StringVar(&configFile, "config-file", configFile, "not in the lab")
	if err := flags.Parse(args); err != nil {
		return cfg, false, err
	}
	if flags.NArg() > 0 {
		return cfg, false, fmt.Errorf("unexpected arguments %v", flags.Args())
	}
	if *showVersion {
		return cfg, true, nil
	}
	switch {
	case cfg.idStrategy != "uuid" && cfg.idStrategy != "index":
		return cfg, false, fmt.Errorf("unable to validate flags: invalid --device-id-strategy option: %v", cfg.idStrategy)
	case migStrategy != "none" && migStrategy != "single" && migStrategy != "mixed":
		return cfg, false, fmt.Errorf("unable to validate flags: invalid --mig-strategy option: %v", migStrategy)
	case listStrategy != "envvar":
		return cfg, false, fmt.Errorf("--device-list-strategy %s: the lab's plugin passes devices by envvar only "+
			"(CDI and volume-mounts need the real NVIDIA Container Toolkit)", listStrategy)
	case passDeviceSpecs || gds || mofed:
		return cfg, false, errors.New("PASS_DEVICE_SPECS, GDS_ENABLED and MOFED_ENABLED are not stood in by the " +
			"lab's plugin (there are no GPU device nodes to pass)")
	case configFile != "":
		return cfg, false, fmt.Errorf("--config-file %s: the lab's plugin reads no config file", configFile)
	}
	cfg.filter = xidFilterFromEnv()
	return cfg, false, nil
}

// startPlugin initialises the simulated NVML and starts the plugin. retry: registration failed, try again later.
// A nil plugin without error: nothing to serve, wait (no GPU, or an init error with fail-on-init-error false).
func startPlugin(cfg config) (plugin *devicePlugin, retry bool, err error) {
	logf('I', "Loading configuration: fail-on-init-error=%t device-id-strategy=%s device-list-strategy=envvar "+
		"NVML state %s, library %s", cfg.failOnInitError, cfg.idStrategy, cfg.nvml.statePath, cfg.nvml.libraryPath)
	state, err := cfg.nvml.initialize()
	if errors.Is(err, errNoLibrary) {
		logf('I', "Detected non-NVML platform: could not load NVML library: %v", err)
		logf('E', "Incompatible platform detected")
		logf('E', "If this is a GPU node, did you configure the NVIDIA Container Toolkit?")
		logf('E', "If this is not a GPU node, you should set up a toleration or nodeSelector to only deploy this "+
			"plugin on GPU nodes")
		if cfg.failOnInitError {
			return nil, false, errors.New("error creating plugin manager: platform detection failed")
		}
		logf('I', "No devices found. Waiting indefinitely.")
		return nil, false, nil
	}
	if err != nil {
		logf('E', "Failed to initialize NVML: %v.", err)
		if errors.Is(err, errDriverNotLoaded) {
			logf('E', "(lab) no simulated NVML state at %s: the node's GPUs are not initialised (fake-nvml init)",
				cfg.nvml.statePath)
		}
		logf('E', "If this is a GPU node, did you set the docker default runtime to `nvidia`?")
		logf('E', "If this is not a GPU node, you should set up a toleration or nodeSelector to only deploy this "+
			"plugin on GPU nodes")
		if cfg.failOnInitError {
			return nil, false, fmt.Errorf("error creating plugin manager: nvml init failed: %v", err)
		}
		logf('W', "nvml init failed: %v", err)
		logf('I', "No devices found. Waiting indefinitely.")
		return nil, false, nil
	}
	devices, err := enumerate(state)
	if err != nil {
		return nil, false, fmt.Errorf("error getting plugins: failed to construct NVML resource managers: %v", err)
	}
	if len(devices) == 0 {
		logf('I', "No devices found. Waiting indefinitely.")
		return nil, false, nil
	}
	for _, d := range devices {
		logf('I', "GPU %d: %s %s (PCI %s)", d.index, d.ID, d.name, d.busID)
	}
	plugin = newDevicePlugin(cfg, state, devices)
	if err := plugin.start(); err != nil {
		logf('E', "Could not contact Kubelet. Did you enable the device plugin feature gate?")
		return nil, true, nil
	}
	return plugin, false, nil
}

// run is the real plugin's main loop: start, then restart on a new kubelet.sock, on SIGHUP or after a failed
// registration; stop on any other signal or when CTX ends.
func run(ctx context.Context, cfg config, signals <-chan os.Signal) error {
	logf('I', "Starting FS watcher.")
	watcher, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("failed to create FS watcher: %v", err)
	}
	defer watcher.Close()
	if err := watcher.Add(cfg.dir); err != nil {
		return fmt.Errorf("failed to create FS watcher for %s: %v", cfg.dir, err)
	}
	logf('I', "Starting OS watcher.")
	kubeletSocket := filepath.Join(cfg.dir, kubeletSocketName)

	var plugin *devicePlugin
	defer func() { plugin.shutdown() }()
	for {
		plugin.shutdown()
		logf('I', "Starting Plugins.")
		var retry bool
		plugin, retry, err = startPlugin(cfg)
		if err != nil {
			return fmt.Errorf("error starting plugins: %v", err)
		}
		var retryAfter <-chan time.Time
		if retry {
			logf('I', "Failed to start one or more plugins. Retrying in %s...", cfg.retryInterval)
			retryAfter = time.After(cfg.retryInterval)
		}
		if !waitForRestart(ctx, watcher, signals, retryAfter, kubeletSocket) {
			return nil
		}
	}
}

// waitForRestart: true when the plugin must start again, false when it must stop.
func waitForRestart(ctx context.Context, watcher *fsnotify.Watcher, signals <-chan os.Signal,
	retryAfter <-chan time.Time, kubeletSocket string) bool {
	for {
		select {
		case <-ctx.Done():
			return false
		case <-retryAfter:
			return true
		case event := <-watcher.Events:
			if event.Name == kubeletSocket && event.Has(fsnotify.Create) {
				logf('I', "inotify: %s created, restarting.", kubeletSocket)
				return true
			}
		case err := <-watcher.Errors:
			logf('I', "inotify: %s", err)
		case sig := <-signals:
			if sig == syscall.SIGHUP {
				logf('I', "Received SIGHUP, restarting.")
				return true
			}
			logf('I', "Received signal %q, shutting down.", sig)
			return false
		}
	}
}

func main() {
	cfg, showVersion, err := parseConfig(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		logf('E', "%v", err)
		os.Exit(1)
	}
	if showVersion {
		fmt.Printf("NVIDIA Device Plugin version %s (llm-lab: device-plugin API %s, simulated NVML)\n", version,
			pluginapi.Version)
		return
	}
	signals := make(chan os.Signal, 4)
	signal.Notify(signals, syscall.SIGHUP, syscall.SIGINT, syscall.SIGTERM, syscall.SIGQUIT)
	if err := run(context.Background(), cfg, signals); err != nil {
		logf('E', "%v", err)
		os.Exit(1)
	}
}
