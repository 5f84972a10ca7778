package gpuscore

// The placement decision, ported from the extender's scoring.py, which stays the specification: every function
// here has its Python twin of the same name, and testdata/vectors.json (generated from scoring.py) pins the two
// together, reasons and float rounding included.
//
// Float arithmetic follows the Python expression by expression. float64(...) around each product keeps the Go
// compiler from fusing a*b+c into one FMA instruction (allowed on arm64 and others), which rounds differently.

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"sync/atomic"
)

const (
	MinScore     = 0
	MaxScore     = 10 // kube-scheduler's MaxExtenderPriority: the extender's scale
	NeutralScore = 5
)

// Strategy is SCORING_STRATEGY / scoringStrategy.
type Strategy string

const (
	StrategySpread Strategy = "spread"
	StrategyPack   Strategy = "pack"
	StrategyAuto   Strategy = "auto"
)

// Mode is the ranking in force for one resource.
type Mode string

const (
	ModeSpread Mode = "spread"
	ModePack   Mode = "pack"
)

// Outcome says why a node got its verdict (the extender's decisions metric label).
type Outcome string

const (
	OutcomePass           Outcome = "pass"
	OutcomeNoGPURequest   Outcome = "no_gpu_request"
	OutcomeOverloaded     Outcome = "overloaded"
	OutcomeMissingAllowed Outcome = "missing_metrics_allowed"
	OutcomeMissingDenied  Outcome = "missing_metrics_denied"
	OutcomeTenantMismatch Outcome = "tenant_mismatch"
)

// Policy holds what a verdict depends on besides the inputs (scoring.Policy).
type Policy struct {
	GPUUtilThreshold float64
	MemUtilThreshold float64
	WeightGPUUtil    float64
	WeightMemUtil    float64
	MaxAgeSeconds    float64 // 0: samples never go stale
	DenyMissing      bool
	Strategy         Strategy
	PackTargetUtil   float64
	AutoPackBelow    float64
	AutoHysteresis   float64
	// SharedResources: time-sliced resources and their replicas per device (SHARED_RESOURCES).
	SharedResources map[string]int
	// InterferenceWeight: spread subtracts it times the load of the node's other devices (0: off).
	InterferenceWeight float64
	// SharedMemFreeMin: share of memory that must be free on each device a time-sliced pod may get (0: off).
	SharedMemFreeMin float64
}

// replicasOf is the time-slicing replicas of resource (1: exclusive devices).
func (p *Policy) replicasOf(resource string) int {
	if replicas, ok := p.SharedResources[resource]; ok {
		return replicas
	}
	return 1
}

func (p *Policy) modeFor(resource string, modes map[string]Mode) Mode {
	if p.Strategy == StrategyPack {
		return ModePack
	}
	if p.Strategy == StrategyAuto && len(modes) > 0 {
		if mode, ok := modes[resource]; ok {
			return mode
		}
	}
	return ModeSpread
}

func (p *Policy) MissingPolicyName() string {
	if p.DenyMissing {
		return "deny"
	}
	return "allow"
}

// Device is the load of one GPU or MIG instance: Util and Mem in 0..1, HasMem false when FB metrics are missing.
// Pods is how many pods hold it at the sample (time-slicing); HasPods false when the source does not say.
type Device struct {
	Key     string
	Util    float64
	Mem     float64
	HasMem  bool
	Pods    int
	HasPods bool
}

// NodeMetrics is one node of a snapshot: devices per extended resource name, sorted by key.
type NodeMetrics struct {
	Name       string
	SampleTime float64 // newest sample, unix seconds
	Devices    map[string][]Device
	// Resources lists the keys of Devices in the source's order (Python's dict order); sums over every device of
	// the node add them up in this order, so the float result is the extender's to the last bit. Nil: sorted.
	Resources []string
	// ranked holds Devices least-loaded first for the policy given to Snapshot.Rank: sorting once per snapshot
	// instead of once per pod and node keeps Filter and Score at a few comparisons per device. A node has one to
	// three resources: a short list searched in order is cheaper than a map on this path.
	ranked []rankedResource
}

type rankedResource struct {
	resource string
	devices  []Device
	memo     atomic.Pointer[partMemo] // made on the first verdict asked of this resource
}

// rankedDevices is the resource's devices least-loaded first.
func (m *NodeMetrics) rankedDevices(resource string, p *Policy) []Device {
	if m.ranked == nil {
		return byLoad(m.Devices[resource], p)
	}
	if r := m.rankedResource(resource); r != nil {
		return r.devices
	}
	return nil
}

// rankedResource is resource's entry of a ranked snapshot (nil when the snapshot was not ranked or the node has
// no such device).
func (m *NodeMetrics) rankedResource(resource string) *rankedResource {
	for i := range m.ranked {
		if m.ranked[i].resource == resource {
			return &m.ranked[i]
		}
	}
	return nil
}

// partMemo remembers one resource's part of a node's verdict for the inputs a scheduling burst repeats: each pod's
// cycle asks the same question of several hundred nodes, twice (Filter, Score), and a node's answer changes only
// when a new snapshot arrives (a new memo) or its in-flight count moves. A failing part also keeps its reason text,
// which Filter asks for on every node that fails. Entries are written once, by whichever goroutine computes them
// first; a race computes the same value twice, never a different one.
type partMemo struct {
	words   [memoEntries]atomic.Uint32
	reasons atomic.Pointer[[memoEntries]atomic.Pointer[string]] // made on the first failing part
}

const (
	memoCounts  = 4  // devices asked of the resource: 1..4
	memoAssumed = 16 // in-flight pods' devices on the node: 0..15
	memoEntries = memoCounts * memoAssumed * 2
	memoSet     = 1 << 31
	memoPassed  = 1 << 30
)

func memoIndex(count, assumed int, mode Mode) (int, bool) {
	if count < 1 || count > memoCounts || assumed < 0 || assumed >= memoAssumed {
		return 0, false
	}
	i := ((count-1)*memoAssumed + assumed) * 2
	if mode == ModePack {
		i++
	}
	return i, true
}

// memoizedPart is evaluateResource (and withInterference) from r's memo when it holds the answer. The memo is
// keyed by what a part depends on besides the snapshot and the policy it was ranked with (the plugins that share a
// refresher share its args): the count, the in-flight devices of this resource and the mode. Interference also
// reads the in-flight pods of the node's other resources, so with interference on only a node without in-flight
// pods is memoized. A part passes or is overloaded, with a score: 32 bits hold it. With reasons, only a failing
// part's text is kept (the scheduling path asks for no other).
func memoizedPart(node string, metrics *NodeMetrics, r *rankedResource, want ResourceRequest, p *Policy,
	assumed map[string]int, mode Mode, reasons bool) Verdict {
	compute := func() Verdict { return judgePart(node, metrics, r.devices, want, p, assumed, mode, reasons) }
	i, ok := memoIndex(want.Count, assumed[want.Resource], mode)
	if !ok || (p.InterferenceWeight > 0 && len(assumed) > 0) {
		return compute()
	}
	memo := r.memo.Load()
	if memo == nil {
		r.memo.CompareAndSwap(nil, new(partMemo))
		memo = r.memo.Load()
	}
	word := memo.words[i].Load()
	switch {
	case word&memoSet == 0:
	case word&memoPassed != 0:
		if !reasons {
			return Verdict{true, int(word & 0xff), OutcomePass, ""}
		}
	case !reasons:
		return Verdict{false, int(word & 0xff), OutcomeOverloaded, ""}
	default:
		if texts := memo.reasons.Load(); texts != nil {
			if text := texts[i].Load(); text != nil {
				return Verdict{false, int(word & 0xff), OutcomeOverloaded, *text}
			}
		}
	}
	part := compute()
	word = uint32(memoSet) | uint32(part.Score)&0xff
	switch {
	case part.Passed && part.Outcome == OutcomePass:
		memo.words[i].Store(word | memoPassed)
	case !part.Passed && part.Outcome == OutcomeOverloaded:
		memo.words[i].Store(word)
		if reasons {
			if memo.reasons.Load() == nil {
				memo.reasons.CompareAndSwap(nil, new([memoEntries]atomic.Pointer[string]))
			}
			memo.reasons.Load()[i].Store(&part.Reason)
		}
	}
	return part
}

// judgePart is one resource's part of a node's verdict: evaluateResource, then interference for spread.
func judgePart(node string, metrics *NodeMetrics, ranked []Device, want ResourceRequest, p *Policy,
	assumed map[string]int, mode Mode, reasons bool) Verdict {
	part := evaluateResource(node, metrics, ranked, want, p, assumed[want.Resource], mode, reasons)
	if part.Passed && mode == ModeSpread && p.InterferenceWeight > 0 {
		part = withInterference(node, metrics, ranked, want, p, assumed, part, reasons)
	}
	return part
}

// Rank orders every node's devices by load under p once, before the snapshot is published; a snapshot is
// then read-only, so the scheduler's parallel Filter and Score calls share the result without locks. A node ranked
// already is left as it is: a source that carries an unchanged node over into its next snapshot (SnapshotOfNodes)
// ranks it with the same policy, and its memo stays as true as its devices.
func (s *Snapshot) Rank(p *Policy) {
	for _, metrics := range s.Nodes {
		if metrics.ranked != nil {
			continue
		}
		metrics.ranked = make([]rankedResource, 0, len(metrics.Devices))
		for resource, devices := range metrics.Devices {
			metrics.ranked = append(metrics.ranked, rankedResource{resource: resource, devices: byLoad(devices, p)})
		}
	}
}

// Snapshot is an immutable view of the fleet's load; Order keeps the nodes in the order the source listed them
// (the fleet mean adds them up in that order, as Python's dict does).
type Snapshot struct {
	Nodes        map[string]*NodeMetrics
	Order        []string
	NewestSample float64 // 0 with no node
	Version      uint64
}

// ResourceRequest is count devices of one extended resource; a GPURequest is sorted by resource name.
type ResourceRequest struct {
	Resource string
	Count    int
}

// Verdict is the filter verdict and the 0..10 score of one node.
type Verdict struct {
	Passed  bool
	Score   int
	Outcome Outcome
	Reason  string
}

var noGPUVerdict = Verdict{true, NeutralScore, OutcomeNoGPURequest, ""}

// deviceLoad is w_util x util + w_mem x mem, 0..1.
func deviceLoad(d Device, p *Policy) float64 {
	mem := 0.0
	if d.HasMem {
		mem = d.Mem
	}
	return float64(p.WeightGPUUtil*d.Util) + float64(p.WeightMemUtil*mem)
}

func belowThresholds(d Device, p *Policy) bool {
	return d.Util < p.GPUUtilThreshold && (!d.HasMem || d.Mem < p.MemUtilThreshold)
}

// shortOfMemory is a shared device with less than SharedMemFreeMin of its memory free (scoring.short_of_memory):
// one more replica may run out of memory. False when the rule is off or the sample has no memory figures.
func shortOfMemory(d Device, p *Policy) bool {
	return p.SharedMemFreeMin > 0 && d.HasMem && 1.0-d.Mem < p.SharedMemFreeMin
}

// byLoad returns the devices least-loaded first, ties broken by key (Python sorts (load, key) tuples).
func byLoad(devices []Device, p *Policy) []Device {
	type keyed struct {
		load float64
		d    Device
	}
	entries := make([]keyed, len(devices))
	for i, d := range devices {
		entries[i] = keyed{deviceLoad(d, p), d}
	}
	sort.Slice(entries, func(i, j int) bool {
		if entries[i].load != entries[j].load {
			return entries[i].load < entries[j].load
		}
		return entries[i].d.Key < entries[j].d.Key
	})
	ranked := make([]Device, len(entries))
	for i, e := range entries {
		ranked[i] = e.d
	}
	return ranked
}

// pyRound is Python's round() to an int: halves go to the even neighbour.
func pyRound(x float64) int { return int(math.RoundToEven(x)) }

func clampScore(x float64) int { return max(MinScore, min(MaxScore, pyRound(x))) }

// scoreDevices is the spread score: 10 x (1 - mean load) over count devices, missing devices counting as full.
func scoreDevices(devices []Device, count int, p *Policy) int {
	if count <= 0 {
		return NeutralScore
	}
	total := 0.0
	for _, d := range devices {
		total += deviceLoad(d, p)
	}
	total += float64(max(0, count-len(devices)))
	return clampScore(MaxScore * (1.0 - total/float64(count)))
}

// packScore is TargetLoadPacking's curve on 0..10: rising to 10 at target, falling to 0 at full load.
func packScore(load, target float64) int {
	load = min(1.0, max(0.0, load))
	var raw float64
	if load <= target {
		raw = (1.0-target)*load/target + target
	} else {
		raw = target * (1.0 - load) / (1.0 - target)
	}
	return clampScore(MaxScore * raw)
}

func rankedMeanLoad(ranked []Device, p *Policy, assumed int) float64 {
	taken := min(assumed, len(ranked)) // in-flight pods took the least-loaded devices
	sum := 0.0
	for _, d := range ranked[taken:] {
		sum += deviceLoad(d, p)
	}
	return (float64(taken) + sum) / float64(len(ranked))
}

func deviceWord(resource string) string {
	if resource == WholeGPUResource {
		return "GPU"
	}
	return "instance"
}

// pyG formats like Python's "{:g}" (6 significant digits, no trailing zeros).
func pyG(x float64) string { return strconv.FormatFloat(x, 'g', 6, 64) }

func figures(d Device, p *Policy) string {
	util := fmt.Sprintf("util %.2f", d.Util)
	if d.Util >= p.GPUUtilThreshold {
		util += fmt.Sprintf(" > %.2f", p.GPUUtilThreshold)
	}
	if !d.HasMem {
		return util + ", mem n/a"
	}
	mem := fmt.Sprintf("mem %.2f", d.Mem)
	if d.Mem >= p.MemUtilThreshold {
		mem += fmt.Sprintf(" > %.2f", p.MemUtilThreshold)
	}
	return util + ", " + mem
}

// missing is the verdict on a node without usable metrics; why is called only when reasons are wanted.
func missing(node string, why func() string, p *Policy, reasons bool) Verdict {
	reason := ""
	if reasons {
		reason = fmt.Sprintf("%s: %s (ON_MISSING_METRICS=%s)", node, why(), p.MissingPolicyName())
	}
	if p.DenyMissing {
		return Verdict{false, MinScore, OutcomeMissingDenied, reason}
	}
	return Verdict{true, NeutralScore, OutcomeMissingAllowed, reason}
}

// sharedCandidates is the devices of a time-sliced resource that the device plugin may hand a pod asking for count
// replicas (scoring.shared_candidates): its distributed allocation takes replicas of the devices with the fewest
// pods, ignores load and orders equal devices arbitrarily, so the pod may get any device tied at the last pod count
// it needs. The assumed in-flight pods took theirs first, by the same rule. Empty when fewer than count devices have
// a free replica. devices are in key order (the order Python keeps), and so is the answer within a pod count.
//
// The answer is the candidates' indices into devices, appended to into (a caller's stack buffer): Filter and Score
// run this for every node of every GPU pod's cycle, so it sorts nothing and allocates nothing for up to
// smallDevices devices (the pod counts are small integers: the candidates are collected level by level).
func sharedCandidates(devices []Device, count, replicas, assumed int, into []int) []int {
	var podsBuf [smallDevices]int
	pods := podsBuf[:0]
	if len(devices) > smallDevices {
		pods = make([]int, 0, len(devices))
	}
	for _, d := range devices {
		pods = append(pods, d.Pods) // 0 without a pod count
	}
	// In-flight pods: each on a device with the fewest pods, the first of equals. They fill the lowest level in
	// device order, then the next (a device raised from a level is not taken again at that level).
	for level := 0; level < replicas && assumed > 0; level++ {
		for i := range pods {
			if pods[i] == level && assumed > 0 {
				pods[i]++
				assumed--
			}
		}
	}
	if count <= 0 {
		return into
	}
	// cutoff: the pod count of the count-th open device in (pods, index) order, the most-used one the pod may get.
	cutoff, open := -1, 0
	for level := 0; level < replicas && open < count; level++ {
		for _, n := range pods {
			if n == level {
				open++
			}
		}
		cutoff = level
	}
	if open < count {
		return into
	}
	for level := 0; level <= cutoff; level++ {
		for i, n := range pods {
			if n == level {
				into = append(into, i)
			}
		}
	}
	return into
}

// smallDevices is how many devices of one resource a node has at most without a heap allocation in
// sharedCandidates (an H100 node: 8 GPUs x 7 instances = 56).
const smallDevices = 64

// pyPods is a device's pod count as Python prints an int or None.
func pyPods(d Device) string {
	if !d.HasPods {
		return "None"
	}
	return strconv.Itoa(d.Pods)
}

// evaluateShared judges a time-sliced resource in spread mode by the devices the pod would share
// (scoring._evaluate_shared); ok false when no device of the sample carries a pod count (no pod mapping in
// dcgm-exporter): the caller then judges it the exclusive way.
func evaluateShared(node string, devices []Device, want ResourceRequest, p *Policy, assumed, replicas int, reasons bool) (Verdict, bool) {
	mapped := false
	for _, d := range devices {
		if d.HasPods {
			mapped = true
			break
		}
	}
	if !mapped {
		return Verdict{}, false
	}
	var buf [smallDevices]int
	candidates := sharedCandidates(devices, want.Count, replicas, assumed, buf[:0])
	if len(candidates) == 0 {
		reason := ""
		if reasons {
			reason = fmt.Sprintf("%s: every %s replica taken (%d per device)", node, want.Resource, replicas)
		}
		return Verdict{false, MinScore, OutcomeOverloaded, reason}, true
	}
	for _, i := range candidates {
		if d := devices[i]; !belowThresholds(d, p) { // the plugin may hand the pod any candidate, the hot one included
			reason := ""
			if reasons {
				reason = fmt.Sprintf("%s: the device plugin may share a busy %s %s (%s: %s; %s pod(s), %d equally used)",
					node, want.Resource, deviceWord(want.Resource), d.Key, figures(d, p), pyPods(d), len(candidates))
			}
			return Verdict{false, MinScore, OutcomeOverloaded, reason}, true
		}
	}
	for _, i := range candidates {
		if d := devices[i]; shortOfMemory(d, p) { // its pods would share the little memory left: CUDA out-of-memory
			reason := ""
			if reasons {
				reason = fmt.Sprintf("%s: the device plugin may share a %s %s short of memory (%s: mem %.2f, less than "+
					"SHARED_MEM_FREE_MIN %s free; %s pod(s))",
					node, want.Resource, deviceWord(want.Resource), d.Key, d.Mem, pyG(p.SharedMemFreeMin), pyPods(d))
			}
			return Verdict{false, MinScore, OutcomeOverloaded, reason}, true
		}
	}
	sum := 0.0
	for _, i := range candidates {
		sum += deviceLoad(devices[i], p)
	}
	mean := sum / float64(len(candidates))
	score := clampScore(MaxScore * (1.0 - mean))
	reason := ""
	if reasons {
		reason = fmt.Sprintf("%s: spread: shared %s x%d, %d device(s) it may get, mean load %.2f, score %d",
			node, want.Resource, replicas, len(candidates), mean, score)
	}
	return Verdict{true, score, OutcomePass, reason}, true
}

// interferenceLoad is the mean load of the node's devices other than picked, over every resource
// (scoring.interference_load); the assumed in-flight pods' devices (the least-loaded of their resource) count as
// fully loaded. 0 with no other device.
func interferenceLoad(metrics *NodeMetrics, picked []Device, p *Policy, assumed map[string]int) float64 {
	total, others := 0.0, 0
	resources := metrics.Resources
	if resources == nil {
		resources = sortedKeys(metrics.Devices)
	}
	for _, resource := range resources {
		taken := assumed[resource]
		for position, d := range metrics.rankedDevices(resource, p) {
			if holdsKey(picked, d.Key) {
				continue
			}
			if position < taken {
				total += 1.0
			} else {
				total += deviceLoad(d, p)
			}
			others++
		}
	}
	if others == 0 {
		return 0
	}
	return total / float64(others)
}

// holdsKey: Python compares keys across resources too (a set of keys), so this does as well.
func holdsKey(devices []Device, key string) bool {
	for _, d := range devices {
		if d.Key == key {
			return true
		}
	}
	return false
}

// withInterference is spread on an exclusive resource less InterferenceWeight x the load of the node's other
// devices (scoring._with_interference): a pod next to busy GPUs shares the node's CPUs, PCIe switches, NICs and
// power with them.
func withInterference(node string, metrics *NodeMetrics, ranked []Device, want ResourceRequest, p *Policy,
	assumed map[string]int, verdict Verdict, reasons bool) Verdict {
	if p.replicasOf(want.Resource) > 1 {
		return verdict // shared resources are judged by the devices they share
	}
	taken := min(assumed[want.Resource], len(ranked))
	picked := ranked[taken:min(taken+want.Count, len(ranked))]
	others := interferenceLoad(metrics, picked, p, assumed)
	sum := 0.0
	for _, d := range picked {
		sum += deviceLoad(d, p)
	}
	mean := (sum + float64(max(0, want.Count-len(picked)))) / float64(want.Count)
	score := clampScore(MaxScore * (1.0 - mean - float64(p.InterferenceWeight*others)))
	reason := ""
	if reasons {
		reason = fmt.Sprintf("%s; other devices' load %.2f x INTERFERENCE_WEIGHT %s -> score %d",
			verdict.Reason, others, pyG(p.InterferenceWeight), score)
	}
	return Verdict{true, score, OutcomePass, reason}
}

func evaluateResource(node string, metrics *NodeMetrics, ranked []Device, want ResourceRequest, p *Policy, assumed int, mode Mode, reasons bool) Verdict {
	if replicas := p.replicasOf(want.Resource); replicas > 1 && mode == ModeSpread {
		// The device plugin's choice depends on pod counts in device order, not on load: the unranked list.
		if shared, ok := evaluateShared(node, metrics.Devices[want.Resource], want, p, assumed, replicas, reasons); ok {
			return shared
		}
	}
	available := ranked[min(assumed, len(ranked)):]
	anyBelow := false
	for _, d := range available {
		if belowThresholds(d, p) {
			anyBelow = true
			break
		}
	}
	if !anyBelow {
		if !reasons {
			return Verdict{false, MinScore, OutcomeOverloaded, ""}
		}
		taken := ""
		if assumed > 0 {
			taken = fmt.Sprintf("; %d taken by pods bound since the last sample", assumed)
		}
		best := fmt.Sprintf("all %d assumed busy", len(ranked))
		if len(available) > 0 {
			best = "best: " + figures(available[0], p)
		}
		return Verdict{false, MinScore, OutcomeOverloaded,
			fmt.Sprintf("%s: no %s %s below thresholds (%s%s)", node, want.Resource, deviceWord(want.Resource), best, taken)}
	}
	strategy := ""
	if p.Strategy == StrategyAuto {
		strategy = fmt.Sprintf(" (SCORING_STRATEGY=%s)", p.Strategy)
	}
	if mode == ModePack {
		load := rankedMeanLoad(ranked, p, assumed)
		score := packScore(load, p.PackTargetUtil)
		if !reasons {
			return Verdict{true, score, OutcomePass, ""}
		}
		return Verdict{true, score, OutcomePass, fmt.Sprintf("%s: pack%s: %s load %.2f, target %.2f, score %d",
			node, strategy, want.Resource, load, p.PackTargetUtil, score)}
	}
	score := scoreDevices(available[:min(want.Count, len(available))], want.Count, p)
	if !reasons {
		return Verdict{true, score, OutcomePass, ""}
	}
	return Verdict{true, score, OutcomePass, fmt.Sprintf("%s: spread%s: %s score %d", node, strategy, want.Resource, score)}
}

// Evaluate is the filter verdict and score of node for a pod asking for request (scoring.evaluate_node).
// metrics is nil for a node without metrics; assumed counts in-flight pods' devices per resource; modes is
// auto's choice per resource (fixed strategies ignore it). Without reasons (Reason ""; everything else equal) it is
// the scheduling path's: the reason text is only read when a node fails the filter, so it is built then and not
// for every node and pod.
func Evaluate(node string, metrics *NodeMetrics, request []ResourceRequest, p *Policy, now float64,
	assumed map[string]int, modes map[string]Mode, reasons bool) Verdict {
	if len(request) == 0 {
		return noGPUVerdict
	}
	if metrics == nil {
		return missing(node, func() string { return "no GPU metrics for this node" }, p, reasons)
	}
	age := now - metrics.SampleTime
	if p.MaxAgeSeconds > 0 && age > p.MaxAgeSeconds {
		why := func() string { return fmt.Sprintf("GPU metrics are %.0fs old (max %ss)", age, pyG(p.MaxAgeSeconds)) }
		return missing(node, why, p, reasons)
	}
	var verdict Verdict // the lowest-scoring part (a value: a pointer to the loop's part cost a heap object per call)
	for i, want := range request {
		var part Verdict
		var ranked []Device
		r := metrics.rankedResource(want.Resource) // nil: an unranked snapshot (tests), or no such device
		if r != nil {
			ranked = r.devices
		} else if metrics.ranked == nil {
			ranked = byLoad(metrics.Devices[want.Resource], p)
		}
		if len(ranked) == 0 {
			why := func() string { return fmt.Sprintf("no %s %s in the metrics", want.Resource, deviceWord(want.Resource)) }
			part = missing(node, why, p, reasons)
		} else if r != nil {
			part = memoizedPart(node, metrics, r, want, p, assumed, p.modeFor(want.Resource, modes), reasons)
		} else {
			part = judgePart(node, metrics, ranked, want, p, assumed, p.modeFor(want.Resource, modes), reasons)
		}
		if !part.Passed {
			return part
		}
		if i == 0 || part.Score < verdict.Score {
			verdict = part
		}
	}
	return verdict
}

// FleetMeanLoad is the mean deviceLoad per resource over every device with a fresh sample.
func FleetMeanLoad(s *Snapshot, p *Policy, now float64) map[string]float64 {
	type acc struct {
		total float64
		count int
	}
	totals := map[string]*acc{}
	for _, name := range s.Order {
		metrics := s.Nodes[name]
		if p.MaxAgeSeconds > 0 && now-metrics.SampleTime > p.MaxAgeSeconds {
			continue // a stale node says nothing about the fleet now
		}
		for resource, devices := range metrics.Devices {
			entry := totals[resource]
			if entry == nil {
				entry = &acc{}
				totals[resource] = entry
			}
			sum := 0.0 // Python adds each node's devices first, then the node's sum to the total
			for _, d := range devices {
				sum += deviceLoad(d, p)
			}
			entry.total += sum
			entry.count += len(devices)
		}
	}
	loads := make(map[string]float64, len(totals))
	for resource, entry := range totals {
		if entry.count > 0 {
			loads[resource] = entry.total / float64(entry.count)
		}
	}
	return loads
}

// nextMode is auto's rule: pack below packBelow, spread above packBelow + hysteresis, else keep current
// ("" = no mode yet: spread, the safe default).
func nextMode(current Mode, load, packBelow, hysteresis float64) Mode {
	if load < packBelow {
		return ModePack
	}
	if load > packBelow+hysteresis || current == "" {
		return ModeSpread
	}
	return current
}

// ModeSelector is auto's state: the mode per resource, moved on by each new snapshot. Not safe for concurrent
// use: the refresher owns it and publishes copies of Modes.
type ModeSelector struct {
	PackBelow, Hysteresis float64
	Modes                 map[string]Mode
}

// Update applies a new fleet load and returns the resources whose mode changed.
func (m *ModeSelector) Update(fleetLoad map[string]float64) map[string]Mode {
	if m.Modes == nil {
		m.Modes = map[string]Mode{}
	}
	changed := map[string]Mode{}
	for resource, load := range fleetLoad {
		previous := m.Modes[resource]
		mode := nextMode(previous, load, m.PackBelow, m.Hysteresis)
		if mode != previous {
			changed[resource] = mode
		}
		m.Modes[resource] = mode
	}
	return changed
}

// TenantMismatch is the reason a GPU pod from namespace may not use node's tenant pool, "" when it may.
// Unlabelled nodes are shared; hasNamespaceTenant false means the namespace has no tenant.
func TenantMismatch(node, nodeTenant, namespace, namespaceTenant string) string {
	if nodeTenant == "" || nodeTenant == namespaceTenant {
		return ""
	}
	owner := "no tenant"
	if namespaceTenant != "" {
		owner = "tenant " + namespaceTenant
	}
	return fmt.Sprintf("%s: node is in tenant pool %s; namespace %s belongs to %s", node, pyRepr(nodeTenant), pyRepr(namespace), owner)
}

// pyRepr quotes s as Python's repr() does for the label values Kubernetes allows (no quotes or escapes inside).
func pyRepr(s string) string {
	if !containsRune(s, '\'') {
		return "'" + s + "'"
	}
	if !containsRune(s, '"') {
		return `"` + s + `"`
	}
	return strconv.Quote(s)
}

func containsRune(s string, r rune) bool {
	for _, c := range s {
		if c == r {
			return true
		}
	}
	return false
}
