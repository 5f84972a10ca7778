package gpuscore

// In-flight accounting, the extender's cluster.ClusterState rule with the scheduler's own knowledge as input:
// metrics lag behind bindings, so a burst of pods would all see the same idle node. A GPU pod counts as assumed
// load on its node (it takes the least-loaded devices of its resource) from Reserve, or from the moment the pod
// informer shows it bound by anyone, until the node has a sample newer than the moment its containers started,
// or until inflightMaxSeconds passed (a pod stuck pulling its image must not block a node for ever).

import (
	"maps"
	"math"
	"sync"

	"github.com/gpufleet/mig/k8s/gpuscore"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

type boundPod struct {
	node         string
	request      []gpuscore.ResourceRequest
	boundAt      float64
	runningSince float64 // earliest container start; 0 while not running
	reserved     bool    // from Reserve, not yet seen bound: only Unreserve or deletion forgets it
}

// Inflight is safe for concurrent use: Reserve/Unreserve run in scheduling and binding goroutines, the pod
// informer's handler in its own.
type Inflight struct {
	maxSeconds float64

	mu      sync.Mutex
	pods    map[types.UID]boundPod
	version uint64

	// The last Assumed answer and what it was computed from (a scheduling cycle reads it once).
	cacheVersion  uint64
	cacheSnapshot *gpuscore.Snapshot
	cacheUntil    float64
	cache         map[string]map[string]int
}

func NewInflight(maxSeconds float64) *Inflight {
	return &Inflight{maxSeconds: maxSeconds, pods: map[types.UID]boundPod{}, cacheUntil: math.Inf(-1)}
}

// Reserve counts pod's request on node from now (the scheduler assumed it there).
func (f *Inflight) Reserve(uid types.UID, node string, request []gpuscore.ResourceRequest, now float64) {
	if len(request) == 0 {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	_, replaced := f.pods[uid]
	f.pods[uid] = boundPod{node: node, request: request, boundAt: now, reserved: true}
	cached := f.cacheVersion == f.version && !replaced && now < f.cacheUntil
	f.version++
	if cached {
		// A burst reserves a pod per cycle: add it to the last answer instead of recounting every pod. Copy on
		// write, since earlier cycles may still read the old maps. A pod just reserved runs nowhere yet, so no
		// sample covers it, and it expires after everything counted before it.
		assumed := maps.Clone(f.cache)
		perResource := maps.Clone(assumed[node])
		if perResource == nil {
			perResource = map[string]int{}
		}
		for _, want := range request {
			perResource[want.Resource] += want.Count
		}
		assumed[node] = perResource
		f.cache, f.cacheVersion = assumed, f.version
		f.cacheUntil = min(f.cacheUntil, now+f.maxSeconds)
	}
}

// Unreserve forgets a reservation that did not end in a binding; a pod already seen bound stays.
func (f *Inflight) Unreserve(uid types.UID) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if record, ok := f.pods[uid]; ok && record.reserved {
		delete(f.pods, uid)
		f.version++
	}
}

// Observe applies a pod from the informer (seenAt: when the event arrived); deleted pods are forgotten.
func (f *Inflight) Observe(pod *v1.Pod, deleted bool, seenAt float64) {
	var record *boundPod
	if !deleted {
		record = boundPodOf(pod, seenAt)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	current, known := f.pods[pod.UID]
	switch {
	case record != nil && known && sameContribution(current, *record):
		// The same devices, expiring no later (the binding's PodScheduled time is at or before Reserve's): the
		// last answer stays right, only until when it holds may shrink. Keeps a burst's bindings from forcing a
		// recount of every pod in each cycle.
		f.pods[pod.UID] = *record
		f.cacheUntil = min(f.cacheUntil, record.boundAt+f.maxSeconds)
	case record != nil:
		f.pods[pod.UID] = *record
		f.version++
	case known && (deleted || !current.reserved || terminal(pod)):
		delete(f.pods, pod.UID)
		f.version++
	}
}

func terminal(pod *v1.Pod) bool {
	return pod.Status.Phase == v1.PodSucceeded || pod.Status.Phase == v1.PodFailed
}

// sameContribution: b counts exactly where and as long as a did, or less long.
func sameContribution(a, b boundPod) bool {
	if a.node != b.node || b.boundAt > a.boundAt || a.runningSince != b.runningSince || len(a.request) != len(b.request) {
		return false
	}
	for i := range a.request {
		if a.request[i] != b.request[i] {
			return false
		}
	}
	return true
}

// boundPodOf is the accounting record of a pod object (cluster._bound_pod), nil when it holds no GPU on a node.
func boundPodOf(pod *v1.Pod, seenAt float64) *boundPod {
	if pod.Spec.NodeName == "" || terminal(pod) {
		return nil
	}
	request := gpuscore.PodGPURequest(pod)
	if len(request) == 0 {
		return nil
	}
	record := &boundPod{node: pod.Spec.NodeName, request: request, boundAt: seenAt}
	for _, condition := range pod.Status.Conditions {
		if condition.Type == v1.PodScheduled && condition.Status == v1.ConditionTrue && !condition.LastTransitionTime.IsZero() {
			record.boundAt = float64(condition.LastTransitionTime.Unix())
		}
	}
	for _, status := range pod.Status.ContainerStatuses {
		if running := status.State.Running; running != nil && !running.StartedAt.IsZero() {
			started := float64(running.StartedAt.Unix())
			if record.runningSince == 0 || started < record.runningSince {
				record.runningSince = started
			}
		}
	}
	return record
}

// Assumed is, per node and resource, the devices taken by pods no sample of snapshot covers yet at now.
func (f *Inflight) Assumed(snapshot *gpuscore.Snapshot, now float64) map[string]map[string]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.cacheVersion == f.version && f.cacheSnapshot == snapshot && now < f.cacheUntil {
		return f.cache
	}
	assumed := map[string]map[string]int{}
	until := math.Inf(1)
	for _, pod := range f.pods {
		expires := pod.boundAt + f.maxSeconds
		if now >= expires {
			continue
		}
		if metrics := snapshot.Nodes[pod.node]; pod.runningSince != 0 && metrics != nil && metrics.SampleTime > pod.runningSince {
			continue // a sample taken after the pod started shows its load already
		}
		perResource := assumed[pod.node]
		if perResource == nil {
			perResource = map[string]int{}
			assumed[pod.node] = perResource
		}
		for _, want := range pod.request {
			perResource[want.Resource] += want.Count
		}
		until = min(until, expires)
	}
	f.cacheVersion, f.cacheSnapshot, f.cacheUntil, f.cache = f.version, snapshot, until, assumed
	return assumed
}
