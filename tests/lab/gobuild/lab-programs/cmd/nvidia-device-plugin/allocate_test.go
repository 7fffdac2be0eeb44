package main

import (
	"context"
	"reflect"
	"slices"
	"strings"
	"testing"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

func preferred(t *testing.T, p *devicePlugin, available, required []string, size int32) ([]string, error) {
	t.Helper()
	response, err := p.GetPreferredAllocation(context.Background(), &pluginapi.PreferredAllocationRequest{
		ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{
			{AvailableDeviceIDs: available, MustIncludeDeviceIDs: required, AllocationSize: size},
		},
	})
	if err != nil {
		return nil, err
	}
	return response.ContainerResponses[0].DeviceIDs, nil
}

func TestPreferredAllocationFollowsTheNVLinks(t *testing.T) {
	n := newNode(t)
	n.initGPUs() // NVLink bridges join GPUs 0-1 and 2-3; 0-1 sit on CPU 0, 2-3 on CPU 1
	ids := n.uuids()
	devices, _ := enumerate(n.state())
	p := newDevicePlugin(n.config(), n.state(), devices)
	pair := func(got []string) []string { slices.Sort(got); return got }
	sorted := func(a, b string) []string { return pair([]string{a, b}) }

	for _, tc := range []struct {
		name      string
		available []string
		required  []string
		size      int32
		want      [][]string // any of
	}{
		{"a pair of 4", ids, nil, 2, [][]string{sorted(ids[0], ids[1]), sorted(ids[2], ids[3])}},
		{"the partner of a required GPU", ids, []string{ids[3]}, 2, [][]string{sorted(ids[2], ids[3])}},
		{"across the bridges when it must", []string{ids[0], ids[2], ids[3]}, []string{ids[0]}, 2,
			[][]string{sorted(ids[0], ids[2]), sorted(ids[0], ids[3])}},
		{"the pair left whole", []string{ids[0], ids[2], ids[3]}, nil, 2, [][]string{sorted(ids[2], ids[3])}},
		{"all four", ids, nil, 4, [][]string{pair(slices.Clone(ids))}},
		{"not enough", ids[:1], nil, 2, [][]string{nil}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := preferred(t, p, tc.available, tc.required, tc.size)
			if err != nil {
				t.Fatal(err)
			}
			got = pair(got)
			for _, want := range tc.want {
				if reflect.DeepEqual(got, want) || len(got) == 0 && len(want) == 0 {
					return
				}
			}
			t.Fatalf("got %v, want one of %v", got, tc.want)
		})
	}
	if got, err := preferred(t, p, ids, nil, 1); err != nil || len(got) != 1 {
		t.Fatalf("one GPU: %v, %v", got, err)
	}
}

func TestPreferredAllocationFailsWhileAGPUIsLost(t *testing.T) {
	n := newNode(t)
	n.initGPUs()
	ids := n.uuids()
	devices, _ := enumerate(n.state())
	p := newDevicePlugin(n.config(), n.state(), devices)
	n.fakeNVML("gpu", "--gpu", "3", "--lost")
	_, err := preferred(t, p, ids[:2], nil, 1)
	if err == nil || !strings.Contains(err.Error(), "unable to get device link information") ||
		!strings.Contains(err.Error(), "GPU is lost") {
		t.Fatalf("error %v", err)
	}
}
