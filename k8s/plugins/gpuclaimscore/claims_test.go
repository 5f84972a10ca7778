package gpuclaimscore

// Every case of testdata/dra_vectors.json, generated from plugins/module_utils/dra_placement.py by
// `python tools/dra_vectors.py` (the Python tests regenerate it and compare byte for byte): the room of each GPU
// occupancy, and the score of the device first fit takes there, through scoreChoice as Score calls it.

import (
	"encoding/json"
	"fmt"
	"os"
	"testing"

	"github.com/gpufleet/mig/k8s/gpumetrics"
	"github.com/gpufleet/mig/k8s/gpuscore"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/structured"
)

type draVectorFile struct {
	Version      int `json:"version"`
	MemorySlices int `json:"memorySlices"`
	LossWeight   int `json:"lossWeight"`
	Cases        []struct {
		Occupied []int  `json:"occupied"`
		Room     int    `json:"room"`
		Kind     string `json:"kind"`
		Size     int    `json:"size"`
		Start    *int   `json:"start"`
		Loss     *int   `json:"loss"`
		Score    *int64 `json:"score"`
	} `json:"cases"`
}

func loadDRAVectors(t *testing.T) draVectorFile {
	t.Helper()
	raw, err := os.ReadFile("testdata/dra_vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var file draVectorFile
	if err := json.Unmarshal(raw, &file); err != nil {
		t.Fatal(err)
	}
	if file.Version != 1 || file.MemorySlices != memorySlices || file.LossWeight != lossWeight {
		t.Fatalf("dra_vectors.json: version %d, %d memory slices, loss weight %d; this code knows 1, %d, %d",
			file.Version, file.MemorySlices, file.LossWeight, memorySlices, lossWeight)
	}
	if len(file.Cases) < 1000 {
		t.Fatalf("dra_vectors.json has only %d cases", len(file.Cases))
	}
	return file
}

func TestDRAVectorsRoom(t *testing.T) {
	for _, c := range loadDRAVectors(t).Cases {
		if got := room(sets.New(c.Occupied...)); got != c.Room {
			t.Errorf("room(%v) = %d, dra_placement.room says %d", c.Occupied, got, c.Room)
		}
	}
}

func TestDRAVectorsScore(t *testing.T) {
	gpu := gpuKey{"gpu.nvidia.com", "node-a", "gpu-0-counter-set"}
	scored := 0
	for _, c := range loadDRAVectors(t).Cases {
		if c.Start == nil {
			continue // first fit finds no device: the allocator fails the node before any score
		}
		name := fmt.Sprintf("gpu-0-%s-%d", c.Kind, *c.Start)
		var slices []int
		for i := *c.Start; i < *c.Start+c.Size; i++ {
			slices = append(slices, i)
		}
		devices := map[structured.DeviceID]placement{
			structured.MakeDeviceID(gpu.driver, gpu.pool, name): {gpu: gpu, slices: slices},
		}
		occupied := map[gpuKey]sets.Set[int]{gpu: sets.New(c.Occupied...)}
		results := []resourceapi.AllocationResult{{Devices: resourceapi.DeviceAllocationResult{
			Results: []resourceapi.DeviceRequestAllocationResult{{Driver: gpu.driver, Pool: gpu.pool, Device: name}},
		}}}
		if got, placed := scoreChoice(occupied, devices, results); !placed || got != *c.Score {
			t.Errorf("%s at %d on %v: score %d, dra_placement says %d (loss %d)", c.Kind, *c.Start, c.Occupied, got, *c.Score, *c.Loss)
		}
		if occupied[gpu].Len() != len(c.Occupied) {
			t.Fatalf("scoreChoice changed the occupancy it was given")
		}
		scored++
	}
	if scored < 500 {
		t.Fatalf("only %d cases with a placement", scored)
	}
}

func TestMemorySliceCountersOnlyNamePlacements(t *testing.T) {
	for counter, want := range map[string]int{"memory-slice-0": 0, "memory-slice-7": 7} {
		if got, ok := memorySliceIndex(counter); !ok || got != want {
			t.Errorf("memorySliceIndex(%q) = %d, %v", counter, got, ok)
		}
	}
	for _, counter := range []string{"memory", "memory-slice-8", "memory-slice--1", "memory-slice-x", "multiprocessors"} {
		if _, ok := memorySliceIndex(counter); ok {
			t.Errorf("memorySliceIndex(%q) accepted", counter)
		}
	}
}

// claimCycle is PreScore's state for two nodes of one GPU each with the same occupancy, and the allocator's
// result for a 1g.10gb claim on each: the same placement, so only the load can part them.
func claimCycle(snapshot *gpuscore.Snapshot, now float64) (*claimState, map[string][]resourceapi.AllocationResult) {
	s := &claimState{
		devices:  map[structured.DeviceID]placement{},
		occupied: map[gpuKey]sets.Set[int]{},
		view:     &gpumetrics.View{Snapshot: snapshot},
		now:      now,
	}
	results := map[string][]resourceapi.AllocationResult{}
	for _, node := range []string{"cool", "hot"} {
		gpu := gpuKey{"gpu.nvidia.com", node, "gpu-0-counter-set"}
		device := "gpu-0-mig-1g10gb-19-1"
		s.devices[structured.MakeDeviceID(gpu.driver, gpu.pool, device)] = placement{gpu: gpu, slices: []int{1}}
		s.occupied[gpu] = sets.New(0) // a 1g.10gb at slice 0 already
		results[node] = []resourceapi.AllocationResult{{Devices: resourceapi.DeviceAllocationResult{
			Results: []resourceapi.DeviceRequestAllocationResult{{Driver: gpu.driver, Pool: gpu.pool, Device: device}},
		}}}
	}
	return s, results
}

const mig = "nvidia.com/mig-2g.20gb"

// loads: node -> the util of its devices (a whole GPU and a MIG instance), sampled at now.
func claimFleet(now float64, loads map[string][2]float64) *gpuscore.Snapshot {
	s := &gpuscore.Snapshot{Nodes: map[string]*gpuscore.NodeMetrics{}}
	for _, name := range []string{"cool", "hot"} {
		util, ok := loads[name]
		if !ok {
			continue
		}
		s.Nodes[name] = &gpuscore.NodeMetrics{Name: name, SampleTime: now, Resources: []string{gpuscore.WholeGPUResource, mig},
			Devices: map[string][]gpuscore.Device{
				gpuscore.WholeGPUResource: {{Key: "1", Util: util[0], HasMem: true}},
				mig:                       {{Key: "0/1", Util: util[1], HasMem: true}},
			}}
		s.Order = append(s.Order, name)
	}
	return s
}

func TestClaimScoreLosesPointsForLoad(t *testing.T) {
	const now = 1_750_000_000.0
	plugin := newClaimScore(nil, gpuscore.DefaultArgs(), nil)
	plugin.clock = func() float64 { return now }
	s, results := claimCycle(claimFleet(now, map[string][2]float64{"cool": {0.1, 0.1}, "hot": {0.7, 0.7}}), now)
	cool, hot := plugin.nodeScore(s, "cool", results["cool"]), plugin.nodeScore(s, "hot", results["hot"])
	placementOnly, _ := scoreChoice(s.occupied, s.devices, results["cool"])
	// Same placement (loss 0, 7 free slices: 93); load 0.7 x 0.1 util -> score 9, 0.7 x 0.7 -> 5.
	if cool != placementOnly-gpuscore.ClaimLoadWeight*1 || hot != placementOnly-gpuscore.ClaimLoadWeight*5 {
		t.Fatalf("placement %d: cool %d, hot %d; want %d and %d", placementOnly, cool, hot,
			placementOnly-gpuscore.ClaimLoadWeight, placementOnly-5*gpuscore.ClaimLoadWeight)
	}
}

func TestClaimScoreHotNodeLosesEvenWithTheBetterPlacement(t *testing.T) {
	const now = 1_750_000_000.0
	plugin := newClaimScore(nil, gpuscore.DefaultArgs(), nil)
	// Every device of "hot" at or above the 0.8 utilisation threshold: GPUScore would filter it.
	s, results := claimCycle(claimFleet(now, map[string][2]float64{"cool": {0.5, 0.5}, "hot": {0.8, 0.95}}), now)
	s.occupied[gpuKey{"gpu.nvidia.com", "cool", "gpu-0-counter-set"}] = sets.New[int]() // cool breaks an empty GPU
	coolPlacement, _ := scoreChoice(s.occupied, s.devices, results["cool"])
	hotPlacement, _ := scoreChoice(s.occupied, s.devices, results["hot"])
	if coolPlacement >= hotPlacement {
		t.Fatalf("test set-up: cool's placement %d should be worse than hot's %d", coolPlacement, hotPlacement)
	}
	cool, hot := plugin.nodeScore(s, "cool", results["cool"]), plugin.nodeScore(s, "hot", results["hot"])
	if hot != 0 || cool <= hot {
		t.Fatalf("hot node scored %d, cool %d: a node above the thresholds must score 0", hot, cool)
	}
}

func TestClaimScoreFollowsMissingAndStaleMetricsPolicy(t *testing.T) {
	const now = 1_750_000_000.0
	for _, c := range []struct {
		onMissing string
		snapshot  *gpuscore.Snapshot
		want      func(placement int64) int64
	}{
		// No metrics for "hot" (allow): neutral load 5 -> 25 points off; deny: 0.
		{"allow", claimFleet(now, map[string][2]float64{"cool": {0, 0}}), func(p int64) int64 { return p - 5*gpuscore.ClaimLoadWeight }},
		{"deny", claimFleet(now, map[string][2]float64{"cool": {0, 0}}), func(int64) int64 { return 0 }},
		// Samples older than metricsMaxAgeSeconds (30) count as missing.
		{"deny", claimFleet(now-31, map[string][2]float64{"cool": {0, 0}, "hot": {0, 0}}), func(int64) int64 { return 0 }},
	} {
		args := gpuscore.DefaultArgs()
		args.OnMissingMetrics = c.onMissing
		plugin := newClaimScore(nil, args, nil)
		s, results := claimCycle(c.snapshot, now)
		placement, _ := scoreChoice(s.occupied, s.devices, results["hot"])
		if got := plugin.nodeScore(s, "hot", results["hot"]); got != c.want(placement) {
			t.Errorf("onMissingMetrics %s: score %d, want %d", c.onMissing, got, c.want(placement))
		}
	}
}

func TestClaimScoreKeepsPlacementOrderAtEqualLoad(t *testing.T) {
	const now = 1_750_000_000.0
	plugin := newClaimScore(nil, gpuscore.DefaultArgs(), nil)
	s, results := claimCycle(claimFleet(now, map[string][2]float64{"cool": {0.3, 0.3}, "hot": {0.3, 0.3}}), now)
	s.occupied[gpuKey{"gpu.nvidia.com", "hot", "gpu-0-counter-set"}] = sets.New[int]() // hot breaks an empty GPU
	if cool, hot := plugin.nodeScore(s, "cool", results["cool"]), plugin.nodeScore(s, "hot", results["hot"]); cool <= hot {
		t.Fatalf("equal load: cool %d should beat hot %d on placement", cool, hot)
	}
}
