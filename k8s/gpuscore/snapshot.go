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

type deviceAcc struct {
	gpu, profile                      string
	utilPercent, grActive, used, free *float64 // nil: no sample; else into values
	values                            [4]float64
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
func buildSnapshot(samples []Sample, nodeLabels []string, defaultTime float64, nodeSampleTimes map[string]float64, version uint64) *Snapshot {
	// Sized for dcgm-exporter's 3-4 series per device, the accumulators made in slabs: a fold allocates per
	// snapshot, not per device (the push form folds a node every time its samples arrive).
	hint := len(samples)/3 + 1
	devices := make(map[deviceKey]*deviceAcc, hint)
	order := make([]deviceKey, 0, hint) // insertion order: Python's dicts keep it, and node order follows from it
	slab := make([]deviceAcc, 0, hint)
	sampleTimes := map[string]float64{}
	for _, s := range samples {
		switch s.Name {
		case metricGPUUtil, metricGREngineActive, metricFBUsed, metricFBFree:
		default:
			continue
		}
		if math.IsNaN(s.Value) || math.IsInf(s.Value, 0) {
			continue
		}
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
			slab = append(slab, deviceAcc{gpu: gpu, profile: profile})
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
		// The newest value of each metric, held in the accumulator itself (no allocation per sample).
		switch s.Name {
		case metricGPUUtil:
			acc.values[0] = s.Value
			acc.utilPercent = &acc.values[0]
		case metricGREngineActive:
			acc.values[1] = s.Value
			acc.grActive = &acc.values[1]
		case metricFBUsed:
			acc.values[2] = s.Value
			acc.used = &acc.values[2]
		default:
			acc.values[3] = s.Value
			acc.free = &acc.values[3]
		}
		if t, ok := sampleTimes[node]; !ok || defaultTime > t {
			sampleTimes[node] = defaultTime
		}
	}

	split := map[[2]string]bool{}
	for _, key := range order {
		if key.instance != "" {
			split[[2]string{key.node, devices[key].gpu}] = true
		}
	}
	snapshot := &Snapshot{Nodes: map[string]*NodeMetrics{}, Version: version}
	// One string per resource name for the whole snapshot: Filter and Score compare the pod's resource with each
	// node's, and bytes shared by every node stay in the CPU's cache where a copy per node would not.
	migResources := map[string]string{}
	for _, key := range order {
		acc := devices[key]
		var resource, deviceName string
		var util *float64
		if key.instance != "" {
			if acc.profile != "" {
				if resource = migResources[acc.profile]; resource == "" {
					resource = MIGResourcePrefix + acc.profile
					migResources[acc.profile] = resource
				}
			}
			util = acc.grActive
			deviceName = key.gpu + "/" + key.instance
		} else {
			if !split[[2]string{key.node, acc.gpu}] {
				resource = WholeGPUResource
			}
			util = acc.grActive
			if acc.utilPercent != nil {
				percent := *acc.utilPercent / 100.0
				util = &percent
			}
			deviceName = key.gpu
		}
		if resource == "" || util == nil {
			continue
		}
		device := Device{Key: deviceName, Util: clamp01(*util)}
		if acc.used != nil && acc.free != nil && *acc.used+*acc.free > 0 {
			device.Mem, device.HasMem = clamp01(*acc.used/(*acc.used+*acc.free)), true
		}
		if acc.podLabel {
			device.Pods, device.HasPods = len(acc.pods), true
		}
		metrics := snapshot.Nodes[key.node]
		if metrics == nil {
			metrics = &NodeMetrics{Name: key.node, Devices: map[string][]Device{}}
			snapshot.Nodes[key.node] = metrics
			snapshot.Order = append(snapshot.Order, key.node)
		}
		if _, seen := metrics.Devices[resource]; !seen {
			metrics.Resources = append(metrics.Resources, resource)
		}
		metrics.Devices[resource] = append(metrics.Devices[resource], device)
	}
	for _, name := range snapshot.Order {
		metrics := snapshot.Nodes[name]
		metrics.SampleTime = defaultTime
		if t, ok := sampleTimes[name]; ok {
			metrics.SampleTime = t
		}
		if t, ok := nodeSampleTimes[name]; ok {
			metrics.SampleTime = t
		}
		for _, list := range metrics.Devices {
			sort.SliceStable(list, func(i, j int) bool { return list[i].Key < list[j].Key })
		}
		if metrics.SampleTime > snapshot.NewestSample || snapshot.NewestSample == 0 {
			snapshot.NewestSample = metrics.SampleTime
		}
	}
	return snapshot
}
