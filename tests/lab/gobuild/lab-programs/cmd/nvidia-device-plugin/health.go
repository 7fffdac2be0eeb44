package main

// Health, as NVIDIA's plugin (v0.20) judges it: it registers each GPU for NVML's XidCriticalError, DoubleBitEcc
// and SingleBitEcc events, marks a GPU Unhealthy on an XidCriticalError event whose Xid is not ignored, skips the
// other event types, marks every GPU Unhealthy when waiting for events fails, and never marks one Healthy again:
// a GPU comes back only when the plugin restarts (kubelet restart, SIGHUP, a new pod). The fake NVML has no event
// queue, so the faults fake-nvml injects are turned into the events the driver reports for them, by comparing
// each reading of the state (every 2 s) with the previous one:
//
//	fake-nvml fault                               driver event                     plugin
//	gpu --lost (fell off the bus), gpu --remove   Xid 79                           Unhealthy
//	ecc --uncorrectable (volatile count rises)    Xid 94 (Ampere), 48 (older)      Unhealthy
//	remap --pending, rows remapped (count rises)  Xid 63                           Unhealthy
//	remap --failure                               Xid 64                           Unhealthy
//	link --down (an active NVLink goes down)      Xid 74                           Unhealthy
//	ecc --corrected                               SingleBitEccError (not an Xid)   skipped
//	ecc --aggregate, temp, power, processes,      none                             Healthy
//	  kernel-version (NVML stays initialised)
//	state unreadable                              waiting for events fails         all Unhealthy
//
// A fault present before the plugin started raised its event before anyone listened: the GPU starts Healthy,
// as the real plugin's GPUs do after a restart.

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
)

const (
	xidGraphicsEngineException uint64 = 13
	xidFellOffTheBus           uint64 = 79
	xidDoubleBitECC            uint64 = 48
	xidContainedECC            uint64 = 94
	xidRowRemapEvent           uint64 = 63
	xidRowRemapFailure         uint64 = 64
	xidNVLinkError             uint64 = 74
	envDisableHealthChecks            = "DP_DISABLE_HEALTHCHECKS"
	envEnableHealthChecks             = "DP_ENABLE_HEALTHCHECKS"
)

// applicationXids: errors of the application, not the GPU, which the real plugin always ignores.
var applicationXids = []uint64{xidGraphicsEngineException, 31, 43, 45, 68, 109}

// xidFilter: which Xids leave a GPU Healthy (DP_DISABLE_HEALTHCHECKS, DP_ENABLE_HEALTHCHECKS, the application
// Xids). "all" or "xids" in the disable list disables every Xid; an Xid in the enable list is always checked.
type xidFilter struct {
	allDisabled bool
	allEnabled  bool
	disabled    map[uint64]bool
	enabled     map[uint64]bool
}

func parseXids(value string) (all bool, xids map[uint64]bool) {
	xids = map[uint64]bool{}
	for _, item := range strings.Split(strings.ToLower(value), ",") {
		item = strings.TrimSpace(item)
		if item == "all" || item == "xids" {
			return true, map[uint64]bool{}
		}
		if id, err := strconv.ParseUint(item, 10, 64); err == nil {
			xids[id] = true
		} else if item != "" {
			logf('I', "Ignoring malformed Xid value %v: %v", item, err)
		}
	}
	return false, xids
}

func xidFilterFromEnv() xidFilter {
	var f xidFilter
	f.allDisabled, f.disabled = parseXids(os.Getenv(envDisableHealthChecks))
	f.allEnabled, f.enabled = parseXids(os.Getenv(envEnableHealthChecks))
	for _, xid := range applicationXids {
		f.disabled[xid] = true
	}
	return f
}

// off: no health checks at all (every Xid disabled and none enabled).
func (f xidFilter) off() bool { return f.allDisabled && !f.allEnabled && len(f.enabled) == 0 }

func (f xidFilter) ignores(xid uint64) bool {
	if f.allEnabled || f.enabled[xid] {
		return false
	}
	return f.allDisabled || f.disabled[xid]
}

func (f xidFilter) ignoredList() []uint64 {
	var ignored []uint64
	for xid := range f.disabled {
		if f.ignores(xid) {
			ignored = append(ignored, xid)
		}
	}
	slices.Sort(ignored)
	return ignored
}

// gpuEvent: what the driver reports for one GPU between two readings.
type gpuEvent struct {
	uuid   string
	xid    uint64 // 0: not an XidCriticalError event
	reason string
}

func (e gpuEvent) String() string {
	if e.xid == 0 {
		return fmt.Sprintf("{Device:%s Type:SingleBitEccError (%s)}", e.uuid, e.reason)
	}
	return fmt.Sprintf("{Device:%s Type:XidCriticalError Xid:%d (%s)}", e.uuid, e.xid, e.reason)
}

// driverEvents: the events raised for the GPUs of DEVICES between the readings BEFORE and AFTER.
func driverEvents(before, after *nvmlState, devices []*device) []gpuEvent {
	var events []gpuEvent
	for _, d := range devices {
		was, now := before.bySlot(d.slot), after.bySlot(d.slot)
		if was == nil || !was.present() || was.Lost {
			continue // already off the bus at the last reading: its event was raised then
		}
		add := func(xid uint64, reason string) { events = append(events, gpuEvent{d.ID, xid, reason}) }
		switch {
		case now == nil || !now.present():
			add(xidFellOffTheBus, "GPU has fallen off the bus: no longer enumerated")
			continue
		case now.Lost:
			add(xidFellOffTheBus, "GPU has fallen off the bus")
			continue
		}
		if now.ECC.Volatile.Uncorrected > was.ECC.Volatile.Uncorrected {
			if now.Architecture >= archAmpere {
				add(xidContainedECC, "uncorrectable ECC error")
			} else {
				add(xidDoubleBitECC, "double bit ECC error")
			}
		}
		if rows, old := now.RemappedRows, was.RemappedRows; rows != nil {
			if old == nil {
				old = &remappedRows{}
			}
			switch {
			case rows.Failure > 0 && old.Failure == 0:
				add(xidRowRemapFailure, "row remapping failure")
			case rows.Pending > 0 && old.Pending == 0,
				rows.Uncorrectable > old.Uncorrectable, rows.Correctable > old.Correctable:
				add(xidRowRemapEvent, "row remapping event")
			}
		}
		if linkWentDown(was, now) {
			add(xidNVLinkError, "NVLink error: a link went down")
		}
		if now.ECC.Volatile.Corrected > was.ECC.Volatile.Corrected {
			add(0, "corrected ECC error")
		}
	}
	return events
}

func linkWentDown(was, now *gpuState) bool {
	active := map[int]bool{}
	for _, link := range was.NVLinks {
		active[link.Link] = link.Active
	}
	for _, link := range now.NVLinks {
		if active[link.Link] && !link.Active {
			return true
		}
	}
	return false
}
