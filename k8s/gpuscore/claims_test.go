package gpuscore

// Every case of testdata/dra_vectors.json, generated from plugins/module_utils/dra_placement.py by
// `python tools/dra_vectors.py` (the Python tests regenerate it and compare byte for byte): the room of each GPU
// occupancy, and the score of the device first fit takes there, through scoreChoice as Score calls it.

import (
	"encoding/json"
	"fmt"
	"os"
	"testing"

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
		if got := scoreChoice(occupied, devices, results); got != *c.Score {
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
