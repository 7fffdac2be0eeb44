package main

// GetPreferredAllocation as the real plugin answers it for whole GPUs: NVIDIA's go-gpuallocator "best effort"
// policy over the links between the GPUs, read from NVML at the time of the call. A pair of GPUs scores by how
// close they sit on PCIe (same board 60, one switch 50, several switches 40, host bridge 30, same CPU 20, across
// CPUs 10) plus 100 for each NVLink joining them; a set scores the sum over its pairs. The policy divides all
// available GPUs into sets of the requested size so that the sum over the sets is highest, then answers the best
// set of that division that holds the GPUs the kubelet requires. Not enough GPUs: an empty answer, not an error.
// NVLinks through NVSwitches are not counted (go-gpuallocator does not handle them either).

import (
	"fmt"
)

// pcieScore by NVML topology level (nvmlGpuTopologyLevel_t: INTERNAL 0, SINGLE 10, MULTIPLE 20, HOSTBRIDGE 30,
// NODE 40, SYSTEM 50).
var pcieScore = map[int]int{0: 60, 10: 50, 20: 40, 30: 30, 40: 20, 50: 10}

const nvlinkScore = 100

func (p *devicePlugin) preferredAllocation(available, required []string, size int) ([]string, error) {
	// The real plugin reads the links through NVML on each call: a lost GPU anywhere on the node fails it.
	state, err := p.nvml.initialize()
	if err != nil {
		return nil, fmt.Errorf("unable to get device link information: %v", err)
	}
	gpus := map[string]*gpuState{}
	for _, gpu := range state.enumerated() {
		if gpu.Lost {
			return nil, fmt.Errorf("unable to get device link information: error creating GPU device %d: %v",
				gpu.Slot, errGPUIsLost)
		}
		gpus[gpu.UUID] = gpu
	}
	lookup := func(what string, ids []string) ([]*gpuState, error) {
		var found []*gpuState
		for _, id := range ids {
			gpu, ok := gpus[id]
			if !ok {
				return nil, fmt.Errorf("unable to retrieve list of %s devices: no GPU with UUID %s", what, id)
			}
			found = append(found, gpu)
		}
		return found, nil
	}
	candidates, err := lookup("available", available)
	if err != nil {
		return nil, err
	}
	must, err := lookup("required", required)
	if err != nil {
		return nil, err
	}
	ids := []string{}
	for _, gpu := range bestEffort(state, candidates, must, size) {
		ids = append(ids, gpu.UUID)
	}
	return ids, nil
}

func pairScore(state *nvmlState, a, b *gpuState) int {
	if a == nil || b == nil || a == b {
		return 0
	}
	score := 0
	if a.Slot < len(state.PCIeTopology) && b.Slot < len(state.PCIeTopology[a.Slot]) {
		score += pcieScore[state.PCIeTopology[a.Slot][b.Slot]]
	}
	for _, link := range a.NVLinks {
		if link.Active && link.RemoteType == "gpu" && link.RemoteSlot != nil && *link.RemoteSlot == b.Slot {
			score += nvlinkScore
		}
	}
	return score
}

func setScore(state *nvmlState, set []*gpuState) int {
	score := 0
	for i := range set {
		for j := i + 1; j < len(set); j++ {
			score += pairScore(state, set[i], set[j])
		}
	}
	return score
}

func holdsAll(set, subset []*gpuState) bool {
	for _, want := range subset {
		found := false
		for _, gpu := range set {
			found = found || gpu == want
		}
		if !found {
			return false
		}
	}
	return true
}

// bestEffort: the set of SIZE GPUs out of AVAILABLE, holding REQUIRED, from the best-scoring division.
func bestEffort(state *nvmlState, available, required []*gpuState, size int) []*gpuState {
	if size <= 0 || len(available) < size || len(required) > size {
		return nil
	}
	// Places 0..len(available)-1 are the GPUs; the places after them are padding, so that the places divide
	// into sets of SIZE. A set is either all GPUs or holds all the padding (never "4 GPUs and a gap" when 5
	// are asked of 8).
	places := len(available)
	for places%size != 0 {
		places++
	}
	gaps := places - len(available)
	gpusOf := func(set []int) (gpus []*gpuState, gap int) {
		for _, place := range set {
			if place < len(available) {
				gpus = append(gpus, available[place])
			} else {
				gap++
			}
		}
		return gpus, gap
	}

	var best [][]int
	bestScore := -1
	var divide func(rest []int, sets [][]int)
	divide = func(rest []int, sets [][]int) {
		if len(rest) == 0 {
			usable, score := false, 0
			for _, set := range sets {
				gpus, gap := gpusOf(set)
				usable = usable || (gap == 0 && holdsAll(gpus, required))
				score += setScore(state, gpus)
			}
			if usable && score > bestScore {
				best, bestScore = append([][]int{}, sets...), score
			}
			return
		}
		// The first remaining place opens the next set, so that no division is visited twice.
		first, others := rest[0], rest[1:]
		chooseSets(others, size-1, func(chosen []int) {
			set := append([]int{first}, chosen...)
			if _, gap := gpusOf(set); gap != 0 && gap != gaps {
				return
			}
			in := map[int]bool{}
			for _, place := range set {
				in[place] = true
			}
			var left []int
			for _, place := range others {
				if !in[place] {
					left = append(left, place)
				}
			}
			divide(left, append(sets, set))
		})
	}
	all := make([]int, places)
	for i := range all {
		all[i] = i
	}
	divide(all, nil)

	var answer []*gpuState
	answerScore := -1
	for _, set := range best {
		gpus, gap := gpusOf(set)
		if gap == 0 && holdsAll(gpus, required) {
			if score := setScore(state, gpus); score > answerScore {
				answer, answerScore = gpus, score
			}
		}
	}
	return answer
}

// chooseSets calls back with every subset of K members of ITEMS, in their order.
func chooseSets(items []int, k int, callback func([]int)) {
	chosen := make([]int, 0, k)
	var walk func(from int)
	walk = func(from int) {
		if len(chosen) == k {
			callback(append([]int{}, chosen...))
			return
		}
		for i := from; i <= len(items)-(k-len(chosen)); i++ {
			chosen = append(chosen, items[i])
			walk(i + 1)
			chosen = chosen[:len(chosen)-1]
		}
	}
	walk(0)
}
