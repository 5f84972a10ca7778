package gpuscore

// dcgm-exporter series -> Snapshot, ported from the extender's snapshot.build_snapshot (the "prometheus"
// section of testdata/vectors.json pins the two together).
//
// Whole GPUs are the series without a MIG instance label, keyed by gpu (or UUID), utilisation from
// DCGM_FI_DEV_GPU_UTIL (percent). MIG instances carry GPU_I_PROFILE/GPU_I_ID; DCGM does not report GPU_UTIL per
// instance, so theirs is DCGM_FI_PROF_GR_ENGINE_ACTIVE (a ratio). Memory is FB_USED / (FB_USED + FB_FREE).
// A GPU split into MIG instances is no nvidia.com/gpu the device plugin hands out, so it is left out.

import (
	"math"
	"slices"
	"sort"
)

const (
	WholeGPUResource  = "nvidia.com/gpu"
	MIGResourcePrefix = "nvidia.com/mig-"

	metricGPUUtil        = "DCGM_FI_DEV_GPU_UTIL"
	metricGREngineActive = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
	metricFBUsed         = "DCGM_FI_DEV_FB_USED"
	metricFBFree         = "DCGM_FI_DEV_FB_FREE"
)

// dcgmMetrics are the series the refresher reads, in the extender's order.
var dcgmMetrics = []string{metricGPUUtil, metricGREngineActive, metricFBUsed, metricFBFree}

// Sample is one series value with its labels (the metric name in Name).
type Sample struct {
	Name   string
	Labels map[string]string
	Value  float64
}

type deviceKey struct{ node, gpu, instance string }

// noSample marks a metric no sample of the device gave.
const noSample = -1

// deviceAcc is one device while a fold groups samples: the index of the last sample of each metric (noSample for
// none; the earlier ones chained through previous), the pods dcgm-exporter maps to it.
type deviceAcc struct {
	gpu, profile                      string
	utilPercent, grActive, used, free int32
	// pods dcgm-exporter maps to the device, each once (a few at most: a list is cheaper than a set); podLabel
	// false: no series of the device had a pod label.
	pods     []podKey
	podLabel bool
}

// podOf is the pod a series is attributed to (no name for none), ok false when the series has no pod label.
// Prometheus renames the exporter's pod to exported_pod when its own target label pod (the exporter's pod)
// clashes, so that one wins.
func podOf(labels map[string]string) (podKey, bool) {
	for _, names := range [2][2]string{{"exported_pod", "exported_namespace"}, {"pod", "namespace"}} {
		if pod, ok := labels[names[0]]; ok {
			if pod == "" {
				return podKey{}, true
			}
			return podKey{labels[names[1]], pod}, true
		}
	}
	return podKey{}, false
}

// podKey is a pod as namespace and name (no string joined per sample: the fold runs for every series).
type podKey struct{ namespace, name string }

func clamp01(x float64) float64 { return min(1.0, max(0.0, x)) }

// nodeNameOf is the value of the first of labels that is set (dcgm-exporter: Hostname, newer images hostname).
func nodeNameOf(labels map[string]string, nodeLabels []string) string {
	for _, label := range nodeLabels {
		if name := labels[label]; name != "" {
			return name
		}
	}
	return ""
}

// buildSnapshot folds samples into a Snapshot. Every sample is dated defaultTime (a Prometheus instant query's
// values carry the evaluation time, not the scrape's); nodeSampleTimes overrides it per node.
//
// The fold is two steps: layoutNodes reads the samples' names and labels (which devices they make, each one's
// resource, pods and place, and which sample gives it each metric), NodeLayout.Node reads their values. The push
// form keeps a node's layout while its series stay the same and runs only the second step when new samples come.
func buildSnapshot(samples []Sample, nodeLabels []string, defaultTime float64, nodeSampleTimes map[string]float64, version uint64) *Snapshot {
	kept := make([]Sample, 0, len(samples))
	values := make([]float64, 0, len(samples))
	for _, s := range samples {
		switch s.Name {
		case metricGPUUtil, metricGREngineActive, metricFBUsed, metricFBFree:
		default:
			continue
		}
		if math.IsNaN(s.Value) || math.IsInf(s.Value, 0) {
			continue
		}
		kept = append(kept, s)
		values = append(values, s.Value)
	}
	snapshot := &Snapshot{Nodes: map[string]*NodeMetrics{}, Version: version}
	for _, layout := range layoutNodes(kept, nodeLabels, map[string]string{}) {
		sampleTime := defaultTime
		if t, ok := nodeSampleTimes[layout.name]; ok {
			sampleTime = t
		}
		metrics := layout.Node(values, sampleTime)
		snapshot.Nodes[layout.name] = metrics
		snapshot.Order = append(snapshot.Order, layout.name)
		if metrics.SampleTime > snapshot.NewestSample || snapshot.NewestSample == 0 {
			snapshot.NewestSample = metrics.SampleTime
		}
	}
	return snapshot
}

// FoldsAsLaidOut says whether a sample of the named dcgm metric with this value takes no part in screening: finite
// and in its metric's range. A node whose samples all do folds as its layout says (NodeLayout.Node).
func FoldsAsLaidOut(name string, value float64) bool {
	limits, ok := validRange[name]
	return ok && limits[0] <= value && value <= limits[1] && !math.IsInf(value, 0)
}

// NodeLayout is what a node's samples make without their values: its resources in the source's order, and each
// resource's devices sorted by key, each with the samples giving its util and memory.
type NodeLayout struct {
	name      string
	resources []string
	ends      []int // devices[ends[i-1]:ends[i]] are resources[i]'s
	devices   []deviceSlot
	previous  []int32 // by sample index: the device's sample of the same metric before it, noSample for none
}

type deviceSlot struct {
	key              string
	util, used, free int32 // the last sample of each; used and free noSample when the device has no memory
	utilPercent      bool  // util is DCGM_FI_DEV_GPU_UTIL, in percent
	pods             int
	hasPods          bool
}

// Node is the node's NodeMetrics with values[i] the value of the i-th sample the layout was made of, every one
// finite (buildSnapshot leaves the others out before the layout; the push form folds a node with any other value
// the whole way).
func (l *NodeLayout) Node(values []float64, sampleTime float64) *NodeMetrics {
	devices := make([]Device, len(l.devices))
	for i, slot := range l.devices {
		util := l.highest(values, slot.util)
		if slot.utilPercent {
			util /= 100.0
		}
		device := Device{Key: slot.key, Util: clamp01(util), Pods: slot.pods, HasPods: slot.hasPods}
		if slot.used != noSample {
			if used, free := l.highest(values, slot.used), l.highest(values, slot.free); used+free > 0 {
				device.Mem, device.HasMem = clamp01(used/(used+free)), true
			}
		}
		devices[i] = device
	}
	metrics := &NodeMetrics{Name: l.name, SampleTime: sampleTime, Devices: make(map[string][]Device, len(l.resources)), Resources: l.resources}
	begin := 0
	for i, resource := range l.resources {
		metrics.Devices[resource] = devices[begin:l.ends[i]:l.ends[i]]
		begin = l.ends[i]
	}
	return metrics
}

// highest is the highest value of the samples of one metric of one device, last one i (scoring's rule: the series
// of one device and metric are pods sharing it, which dcgm-exporter gives the device's one value, or exporters
// that the pull form's query folds with max).
func (l *NodeLayout) highest(values []float64, i int32) float64 {
	value := values[i]
	for j := l.previous[i]; j != noSample; j = l.previous[j] {
		value = max(value, values[j])
	}
	return value
}

// LayoutOfNode is the layout of one node's samples (all of them the node's, named as the dcgm metrics a decision
// reads), nil when they make no device; resource names are shared through intern.
func LayoutOfNode(samples []Sample, nodeLabels []string, intern map[string]string) *NodeLayout {
	if layouts := layoutNodes(samples, nodeLabels, intern); len(layouts) > 0 {
		return layouts[0]
	}
	return nil
}

// layoutNodes groups samples (the dcgm metrics, finite values) into devices and nodes, in the samples' order:
// nodes in the order of their first device (Python's dict order, which the extender's build_snapshot follows).
func layoutNodes(samples []Sample, nodeLabels []string, intern map[string]string) []*NodeLayout {
	// Sized for dcgm-exporter's 3-4 series per device, the accumulators made in slabs: a fold allocates per
	// snapshot, not per device.
	hint := len(samples)/3 + 1
	devices := make(map[deviceKey]*deviceAcc, hint)
	order := make([]deviceKey, 0, hint)
	slab := make([]deviceAcc, 0, hint)
	previous := make([]int32, len(samples))
	for i, s := range samples {
		node := nodeNameOf(s.Labels, nodeLabels)
		if node == "" {
			continue
		}
		gpu := s.Labels["gpu"]
		if gpu == "" {
			gpu = s.Labels["UUID"]
		}
		instance := s.Labels["GPU_I_ID"]
		profile := ""
		if instance != "" {
			profile = s.Labels["GPU_I_PROFILE"]
		}
		key := deviceKey{node, gpu, instance}
		acc := devices[key]
		if acc == nil {
			if len(slab) == cap(slab) {
				slab = make([]deviceAcc, 0, hint)
			}
			slab = append(slab, deviceAcc{gpu: gpu, profile: profile, utilPercent: noSample, grActive: noSample, used: noSample, free: noSample})
			acc = &slab[len(slab)-1]
			devices[key] = acc
			order = append(order, key)
		}
		if pod, ok := podOf(s.Labels); ok { // time-slicing: one series per pod sharing the device
			acc.podLabel = true
			if pod.name != "" && !slices.Contains(acc.pods, pod) {
				acc.pods = append(acc.pods, pod)
			}
		}
		last := &acc.free
		switch s.Name {
		case metricGPUUtil:
			last = &acc.utilPercent
		case metricGREngineActive:
			last = &acc.grActive
		case metricFBUsed:
			last = &acc.used
		}
		previous[i], *last = *last, int32(i)
	}

	split := map[[2]string]bool{}
	for _, key := range order {
		if key.instance != "" {
			split[[2]string{key.node, devices[key].gpu}] = true
		}
	}
	// One string per resource name: Filter and Score compare the pod's resource with each node's, and bytes
	// shared by every node stay in the CPU's cache where a copy per node would not.
	internName := func(name string) string {
		if shared, ok := intern[name]; ok {
			return shared
		}
		intern[name] = name
		return name
	}
	type building struct {
		layout *NodeLayout
		slots  map[string][]deviceSlot
	}
	nodes := map[string]*building{}
	var nodeOrder []*building
	for _, key := range order {
		acc := devices[key]
		var resource string
		slot := deviceSlot{util: acc.grActive, used: noSample, free: noSample}
		if key.instance != "" {
			if acc.profile != "" {
				resource = internName(MIGResourcePrefix + acc.profile)
			}
			slot.key = key.gpu + "/" + key.instance
		} else {
			if !split[[2]string{key.node, acc.gpu}] {
				resource = internName(WholeGPUResource)
			}
			if acc.utilPercent != noSample {
				slot.util, slot.utilPercent = acc.utilPercent, true
			}
			slot.key = key.gpu
		}
		if resource == "" || slot.util == noSample {
			continue
		}
		if acc.used != noSample && acc.free != noSample {
			slot.used, slot.free = acc.used, acc.free
		}
		if acc.podLabel {
			slot.pods, slot.hasPods = len(acc.pods), true
		}
		node := nodes[key.node]
		if node == nil {
			node = &building{layout: &NodeLayout{name: key.node, previous: previous}, slots: map[string][]deviceSlot{}}
			nodes[key.node] = node
			nodeOrder = append(nodeOrder, node)
		}
		if _, seen := node.slots[resource]; !seen {
			node.layout.resources = append(node.layout.resources, resource)
		}
		node.slots[resource] = append(node.slots[resource], slot)
	}
	layouts := make([]*NodeLayout, len(nodeOrder))
	for i, node := range nodeOrder {
		layout := node.layout
		for _, resource := range layout.resources {
			list := node.slots[resource]
			sort.SliceStable(list, func(i, j int) bool { return list[i].key < list[j].key })
			layout.devices = append(layout.devices, list...)
			layout.ends = append(layout.ends, len(layout.devices))
		}
		layouts[i] = layout
	}
	return layouts
}
