package main

import (
	"fmt"
	"reflect"
	"testing"
)

// Each fault fake-nvml injects, and the events (GPU index: Xid, 0 for a skipped non-Xid event) it raises.
func TestFaultsRaiseTheDriversEvents(t *testing.T) {
	for _, tc := range []struct {
		fault []string
		want  map[int][]uint64
	}{
		{[]string{"gpu", "--gpu", "3", "--lost"}, map[int][]uint64{3: {79}}},
		{[]string{"gpu", "--gpu", "2", "--remove"}, map[int][]uint64{2: {79}}},
		{[]string{"ecc", "--gpu", "1", "--uncorrectable", "2"}, map[int][]uint64{1: {94}}},
		{[]string{"ecc", "--gpu", "1", "--uncorrectable", "2", "--aggregate"}, nil},
		{[]string{"ecc", "--gpu", "0", "--corrected", "100"}, map[int][]uint64{0: {0}}},
		{[]string{"remap", "--gpu", "0", "--pending"}, map[int][]uint64{0: {63}}},
		{[]string{"remap", "--gpu", "0", "--uncorrectable", "1"}, map[int][]uint64{0: {63}}},
		{[]string{"remap", "--gpu", "0", "--failure"}, map[int][]uint64{0: {64}}},
		// a bridge link has two ends
		{[]string{"link", "--gpu", "2", "--link", "5", "--down"}, map[int][]uint64{2: {74}, 3: {74}}},
		{[]string{"temp", "--gpu", "0", "--celsius", "95"}, nil},
		{[]string{"power", "--gpu", "0", "--limit-w", "180"}, nil},
		{[]string{"kernel-version", "550.54.15"}, nil},
		{[]string{"process", "--gpu", "0", "--add", "--pid", "4242"}, nil},
	} {
		t.Run(fmt.Sprint(tc.fault), func(t *testing.T) {
			n := newNode(t)
			n.initGPUs()
			before := n.state()
			devices, err := enumerate(before)
			if err != nil {
				t.Fatal(err)
			}
			n.fakeNVML(tc.fault...)
			got := map[int][]uint64{}
			for _, event := range driverEvents(before, n.state(), devices) {
				d := devices[0]
				for _, candidate := range devices {
					if candidate.ID == event.uuid {
						d = candidate
					}
				}
				got[d.index] = append(got[d.index], event.xid)
			}
			if len(got) == 0 {
				got = nil
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("events %v, want %v", got, tc.want)
			}
		})
	}
}

func TestAGPUOffTheBusRaisesOneEvent(t *testing.T) {
	n := newNode(t)
	n.initGPUs()
	devices, _ := enumerate(n.state())
	n.fakeNVML("gpu", "--gpu", "0", "--lost")
	lost := n.state()
	n.fakeNVML("ecc", "--gpu", "0", "--uncorrectable", "1")
	if events := driverEvents(lost, n.state(), devices); len(events) != 0 {
		t.Fatalf("events for a GPU already lost: %v", events)
	}
}

func TestXidFilter(t *testing.T) {
	for _, tc := range []struct {
		disable, enable string
		off             bool
		ignored         []uint64
		checked         []uint64
	}{
		{"", "", false, []uint64{13, 31, 43, 45, 68, 109}, []uint64{48, 63, 64, 74, 79, 94}},
		{"79, 74", "", false, []uint64{13, 74, 79}, []uint64{48, 94}},
		{"all", "", true, []uint64{13, 79, 94}, nil},
		{"xids", "79", false, []uint64{13, 94}, []uint64{79}},
		{"", "13,bogus", false, []uint64{31}, []uint64{13, 79}},
		{"all", "all", false, nil, []uint64{13, 79}},
	} {
		t.Run(tc.disable+"/"+tc.enable, func(t *testing.T) {
			t.Setenv(envDisableHealthChecks, tc.disable)
			t.Setenv(envEnableHealthChecks, tc.enable)
			quietLogs(t)
			f := xidFilterFromEnv()
			if f.off() != tc.off {
				t.Fatalf("off() = %v", f.off())
			}
			for _, xid := range tc.ignored {
				if !f.ignores(xid) {
					t.Errorf("Xid %d checked", xid)
				}
			}
			for _, xid := range tc.checked {
				if f.ignores(xid) {
					t.Errorf("Xid %d ignored", xid)
				}
			}
		})
	}
}
