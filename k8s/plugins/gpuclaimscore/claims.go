// Package gpuclaimscore is GPUClaimScore, a kube-scheduler framework plugin for pods with DRA claims.
package gpuclaimscore

// GPUClaimScore: GPUScore for pods that get their GPUs through DRA ResourceClaims (NVIDIA's DRA driver with
// DynamicMIG). kube-scheduler's allocator takes the first device that fits on the chosen node and has no device
// scoring; what a scheduler can still choose is the node. For each feasible node this plugin asks the allocator
// itself which devices it would take there (the same structured allocator, slices, classes and allocated state as
// the DynamicResources plugin), and scores the node by the room for large profiles that choice would take away:
// the node where first fit fragments the least wins, then the node whose GPU is fullest (packing keeps empty GPUs
// for whole-GPU and 7g claims). Then GPUScore's load rule, on the same snapshot as GPUScore
// (gpuscore/claimload.go): the node's mean device load takes up to 50 points off, and a node GPUScore would filter
// (every device at or above the thresholds; missing or stale metrics under onMissingMetrics deny) scores 0.
//
// The rules are plugins/module_utils/dra_placement.py's (room, loss, score), checked here through
// testdata/dra_vectors.json generated from it. A device's GPU and placement are read from the counters it consumes
// (its counter set, and one memory-slice-<i> counter per memory slice), as NVIDIA's driver publishes them, so no
// device name is parsed.
//
// Limits: it chooses nodes, not devices (the allocator still takes the first fit on the node); it scores and does
// not filter (a hot node loses, it is not refused); devices that consume no memory-slice counters (other drivers,
// GPUs without MIG) count as no loss and bring no load rule; pods without unallocated claims are skipped.

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/gpufleet/mig/k8s/gpumetrics"

	"github.com/gpufleet/mig/k8s/gpuscore"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/wait"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/resourceclaim"
	"k8s.io/dynamic-resource-allocation/structured"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/dynamicresources"
	"k8s.io/kubernetes/pkg/scheduler/framework/plugins/feature"
)

// Name is the plugin's name in the KubeSchedulerConfiguration.
const Name = "GPUClaimScore"

const claimStateKey fwk.StateKey = Name

// Placement rules of dra_placement.py.
const (
	memorySlices    = 8
	lossWeight      = 5
	memorySlicePref = "memory-slice-"
)

// largeBlocks are the (start, size) of the 3g/4g placements: the blocks large profiles need.
var largeBlocks = [][2]int{{0, 4}, {4, 4}}

// ClaimScore is the plugin.
type ClaimScore struct {
	handle   fwk.Handle
	features structured.Features
	celCache *cel.Cache
	policy   gpuscore.Policy
	metrics  *gpumetrics.Refresher
	clock    func() float64
}

var (
	_ fwk.PreScorePlugin = (*ClaimScore)(nil)
	_ fwk.ScorePlugin    = (*ClaimScore)(nil)
)

// New builds the plugin from GPUScore's args (the same names, defaults and checks: the load rule is
// GPUScore's); with equal args both plugins read one Refresher.
func New(ctx context.Context, obj runtime.Object, handle fwk.Handle) (fwk.Plugin, error) {
	args, metrics, err := gpumetrics.StartMetrics(ctx, obj, Name)
	if err != nil {
		return nil, err
	}
	return newClaimScore(handle, args, metrics), nil
}

func newClaimScore(handle fwk.Handle, args gpuscore.Args, metrics *gpumetrics.Refresher) *ClaimScore {
	fts := feature.NewSchedulerFeaturesFromGates(utilfeature.DefaultFeatureGate)
	return &ClaimScore{
		policy:   args.Policy(),
		metrics:  metrics,
		clock:    gpumetrics.Now,
		handle:   handle,
		features: dynamicresources.AllocatorFeatures(fts),
		celCache: cel.NewCache(10, cel.Features{
			EnableConsumableCapacity: fts.EnableDRAConsumableCapacity,
			EnableListTypeAttributes: fts.EnableDRAListTypeAttributes,
		}),
	}
}

func (c *ClaimScore) Name() string { return Name }

// gpuKey names one GPU: its driver, pool and counter set.
type gpuKey struct{ driver, pool, counterSet string }

// placement is what one device takes of its GPU.
type placement struct {
	gpu    gpuKey
	slices []int
}

type claimState struct {
	allocator structured.Allocator
	claims    []*resourceapi.ResourceClaim
	devices   map[structured.DeviceID]placement
	occupied  map[gpuKey]sets.Set[int]
	view      *gpumetrics.View // GPUScore's metrics, one view for the cycle
	now       float64          // the cycle's clock, for metrics age
}

func (s *claimState) Clone() fwk.StateData { return s }

func (c *ClaimScore) PreScore(ctx context.Context, state fwk.CycleState, pod *v1.Pod, _ []fwk.NodeInfo) *fwk.Status {
	manager := c.handle.SharedDRAManager()
	if manager == nil {
		return fwk.NewStatus(fwk.Skip)
	}
	var claims []*resourceapi.ResourceClaim
	for i := range pod.Spec.ResourceClaims {
		name, _, err := resourceclaim.Name(pod, &pod.Spec.ResourceClaims[i])
		if err != nil || name == nil {
			continue // a template's claim not created yet: DynamicResources waits for it
		}
		claim, err := manager.ResourceClaims().Get(pod.Namespace, *name)
		if err != nil || claim.Status.Allocation != nil {
			continue
		}
		claims = append(claims, claim)
	}
	if len(claims) == 0 {
		return fwk.NewStatus(fwk.Skip)
	}
	allocated, err := allocatedDevices(ctx, manager.ResourceClaims())
	if err != nil {
		return fwk.AsStatus(err)
	}
	slices, err := manager.ResourceSlices().ListWithDeviceTaintRules()
	if err != nil {
		return fwk.AsStatus(err)
	}
	allocator, err := structured.NewAllocator(ctx, c.features, structured.AllocatedState{
		AllocatedDevices:         allocated,
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
		AggregatedCapacity:       structured.NewConsumedCapacityCollection(),
	}, manager.DeviceClasses(), slices, c.celCache)
	if err != nil {
		return fwk.AsStatus(err)
	}
	devices := placements(slices)
	occupied := map[gpuKey]sets.Set[int]{}
	for id := range allocated {
		if p, ok := devices[id]; ok {
			if occupied[p.gpu] == nil {
				occupied[p.gpu] = sets.New[int]()
			}
			occupied[p.gpu].Insert(p.slices...)
		}
	}
	state.Write(claimStateKey, &claimState{allocator: allocator, claims: claims, devices: devices, occupied: occupied,
		view: c.metrics.View(), now: c.clock()})
	return nil
}

// allocatedDevices is the allocated state DynamicResources sees (assumed and in-flight claims included), retried
// on the tracker's concurrent-modification error as DynamicResources does.
func allocatedDevices(ctx context.Context, tracker fwk.ResourceClaimTracker) (sets.Set[structured.DeviceID], error) {
	var devices sets.Set[structured.DeviceID]
	err := wait.PollUntilContextTimeout(ctx, time.Microsecond, 5*time.Second, true, func(context.Context) (bool, error) {
		var err error
		devices, err = tracker.ListAllAllocatedDevices()
		if err != nil && strings.Contains(err.Error(), "concurrent") {
			return false, nil
		}
		return err == nil, err
	})
	if err != nil {
		return nil, fmt.Errorf("%s: allocated devices: %w", Name, err)
	}
	return devices, nil
}

// placements reads each device's GPU (counter set) and memory slices from the counters it consumes.
func placements(slices []*resourceapi.ResourceSlice) map[structured.DeviceID]placement {
	out := map[structured.DeviceID]placement{}
	for _, slice := range slices {
		for _, device := range slice.Spec.Devices {
			for _, consumption := range device.ConsumesCounters {
				var taken []int
				for counter := range consumption.Counters {
					if index, ok := memorySliceIndex(counter); ok {
						taken = append(taken, index)
					}
				}
				if len(taken) == 0 {
					continue
				}
				id := structured.MakeDeviceID(slice.Spec.Driver, slice.Spec.Pool.Name, device.Name)
				gpu := gpuKey{slice.Spec.Driver, slice.Spec.Pool.Name, consumption.CounterSet}
				out[id] = placement{gpu: gpu, slices: taken}
			}
		}
	}
	return out
}

func memorySliceIndex(counter string) (int, bool) {
	rest, ok := strings.CutPrefix(counter, memorySlicePref)
	if !ok {
		return 0, false
	}
	index, err := strconv.Atoi(rest)
	return index, err == nil && index >= 0 && index < memorySlices
}

func (c *ClaimScore) Score(ctx context.Context, state fwk.CycleState, pod *v1.Pod, nodeInfo fwk.NodeInfo) (int64, *fwk.Status) {
	data, err := state.Read(claimStateKey)
	if err != nil {
		return 0, nil
	}
	s, ok := data.(*claimState)
	node := nodeInfo.Node()
	if !ok || node == nil {
		return 0, nil
	}
	results, err := s.allocator.Allocate(ctx, node, s.claims)
	if err != nil {
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			return 0, fwk.AsStatus(err)
		}
		return 0, nil // DynamicResources reports allocation errors; a node it let through scores lowest here
	}
	if results == nil {
		return 0, nil
	}
	return c.nodeScore(s, node.Name, results), nil
}

// nodeScore combines the placement score of the devices the allocator would take with the node's load
// (scoring.claim_score); claims that take no GPU placement keep the placement score alone.
func (c *ClaimScore) nodeScore(s *claimState, node string, results []resourceapi.AllocationResult) int64 {
	score, placed := scoreChoice(s.occupied, s.devices, results)
	if !placed {
		return score
	}
	load := gpuscore.ClaimLoadVerdict(node, s.view.Snapshot.Nodes[node], &c.policy, s.now, s.view.Modes, false)
	return gpuscore.ClaimNodeScore(score, load)
}

// scoreChoice: the score of the devices the allocator would take (dra_placement.evaluate_node, summed over a
// pod's devices: the loss of each, in order, and the free slices of the first one's GPU); placed false when none of
// them is a GPU placement.
func scoreChoice(occupied map[gpuKey]sets.Set[int], devices map[structured.DeviceID]placement, results []resourceapi.AllocationResult) (int64, bool) {
	after := map[gpuKey]sets.Set[int]{}
	loss, freeBefore, first := 0, 0, true
	for _, result := range results {
		for _, device := range result.Devices.Results {
			p, ok := devices[structured.MakeDeviceID(device.Driver, device.Pool, device.Device)]
			if !ok {
				continue
			}
			before, seen := after[p.gpu]
			if !seen {
				before = occupied[p.gpu].Clone()
				if before == nil {
					before = sets.New[int]()
				}
			}
			next := before.Clone().Insert(p.slices...)
			loss += room(before) - room(next)
			if first {
				freeBefore, first = memorySlices-before.Len(), false
			}
			after[p.gpu] = next
		}
	}
	return placementScore(loss, freeBefore), !first
}

// room is dra_placement.room: 4 per free 3g/4g block, 8 more when the GPU is empty.
func room(occupied sets.Set[int]) int {
	total := 0
	for _, block := range largeBlocks {
		free := true
		for i := block[0]; i < block[0]+block[1]; i++ {
			if occupied.Has(i) {
				free = false
				break
			}
		}
		if free {
			total += 4
		}
	}
	if occupied.Len() == 0 {
		total += memorySlices
	}
	return total
}

// placementScore is dra_placement.evaluate_node's score, kept within 0..MaxNodeScore.
func placementScore(loss, freeBefore int) int64 {
	score := int64(fwk.MaxNodeScore) - int64(lossWeight*loss) - int64(freeBefore)
	return max(int64(fwk.MinNodeScore), min(int64(fwk.MaxNodeScore), score))
}

func (c *ClaimScore) ScoreExtensions() fwk.ScoreExtensions { return nil }
