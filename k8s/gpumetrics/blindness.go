package gpumetrics

// Blindness: when decisions use no GPU metrics at all (none loaded yet, or the newest sample older than
// metricsMaxAgeSeconds), GPUScore places like a scheduler that knows nothing (onMissingMetrics allow) or places
// nothing (deny). Either way operators must see it: the scheduler metric scheduler_gpuscore_metrics_blind, a
// WARNING log line on each change and every blindWarnEvery while it lasts, and a Warning event (reason
// GPUMetricsBlind) on the pods placed blind, at most one per blindWarnEvery. The extender does the same
// (service.Extender.blind_reason, /readyz's metrics_blind).
//
// Blind for some nodes only: their newest sample is older than metricsMaxAgeSeconds while other nodes' are fresh
// (one exporter or scrape shard behind, or refreshes so slow that the oldest shard ages out before they land).
// The fleet is not blind, yet onMissingMetrics decides for those nodes: scheduler_gpuscore_metrics_stale_nodes
// counts them and a WARNING names a few, on each change and every blindWarnEvery while it lasts
// (service.Extender.stale_nodes, /readyz's metrics_stale_nodes).

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/gpufleet/mig/k8s/gpuscore"

	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/klog/v2"
)

// blindWarnEvery is how often a lasting blindness is logged again and shown on a pod (seconds).
const blindWarnEvery = 60.0

// EventReasonBlind is the reason of the Warning event on a pod placed without metrics.
const EventReasonBlind = "GPUMetricsBlind"

var (
	metricsBlind = metrics.NewGauge(&metrics.GaugeOpts{
		Subsystem:      "scheduler_gpuscore",
		Name:           "metrics_blind",
		Help:           "1 while GPUScore's decisions use no GPU metrics (none loaded, or the newest sample older than metricsMaxAgeSeconds).",
		StabilityLevel: metrics.ALPHA,
	})
	refreshFailures = metrics.NewCounter(&metrics.CounterOpts{
		Subsystem:      "scheduler_gpuscore",
		Name:           "metrics_refresh_failures_total",
		Help:           "Refreshes of GPUScore's metrics snapshot that failed (Prometheus unreachable, too slow, or refusing the query).",
		StabilityLevel: metrics.ALPHA,
	})
	metricsStaleNodes = metrics.NewGauge(&metrics.GaugeOpts{
		Subsystem:      "scheduler_gpuscore",
		Name:           "metrics_stale_nodes",
		Help:           "Nodes whose newest GPU sample is older than metricsMaxAgeSeconds while others' are not: decisions use no metrics there (onMissingMetrics decides). 0 while the whole snapshot is stale (that is scheduler_gpuscore_metrics_blind).",
		StabilityLevel: metrics.ALPHA,
	})
	registerMetrics sync.Once
)

// staleNodesNamed is how many stale nodes the log names (the count is always whole).
const staleNodesNamed = 5

// registerMetricsOnce adds GPUScore's metrics to the scheduler's /metrics (once per process).
func registerMetricsOnce() {
	registerMetrics.Do(func() { legacyregistry.MustRegister(metricsBlind, refreshFailures, metricsStaleNodes) })
}

// BlindReason says why decisions use no metrics at now ("" while they use some): no node in the snapshot, or its
// newest sample older than the policy's maximum age; lastError is the source's last failure, if any.
func BlindReason(s *gpuscore.Snapshot, p *gpuscore.Policy, now float64, lastError string) string {
	reason := ""
	if len(s.Nodes) == 0 {
		reason = "no GPU metrics loaded"
	} else if age := now - s.NewestSample; p.MaxAgeSeconds > 0 && age > p.MaxAgeSeconds {
		reason = fmt.Sprintf("the newest GPU sample is %.0fs old (metricsMaxAgeSeconds %g)", age, p.MaxAgeSeconds)
	}
	if reason != "" && lastError != "" {
		reason += "; last refresh: " + lastError
	}
	return reason
}

// staleNodes is service.Extender.stale_nodes: the nodes whose newest sample is older than the policy's maximum age
// while the snapshot as a whole is fresh (none when it is not: that is BlindReason's case), with a description
// naming the first staleNodesNamed by name.
func staleNodes(s *gpuscore.Snapshot, p *gpuscore.Policy, now float64) (count int, description string) {
	if p.MaxAgeSeconds == 0 || len(s.Nodes) == 0 || now-s.NewestSample > p.MaxAgeSeconds {
		return 0, ""
	}
	limit, oldest := now-p.MaxAgeSeconds, math.Inf(1)
	var stale []string
	for name, node := range s.Nodes {
		if node.SampleTime < limit {
			stale = append(stale, name)
			oldest = math.Min(oldest, node.SampleTime)
		}
	}
	if len(stale) == 0 {
		return 0, ""
	}
	sort.Strings(stale)
	named, more := stale, ""
	if len(stale) > staleNodesNamed {
		named, more = stale[:staleNodesNamed], fmt.Sprintf(" and %d more", len(stale)-staleNodesNamed)
	}
	return len(stale), fmt.Sprintf("samples older than metricsMaxAgeSeconds %g (the oldest %.0fs) on %s%s",
		p.MaxAgeSeconds, now-oldest, strings.Join(named, ", "), more)
}

// blindness is the refresher's record of it: the current reason (read by PreFilter without a lock) and when it
// was last logged and last shown on a pod.
type blindness struct {
	reason    atomic.Pointer[string]
	mu        sync.Mutex
	warned    float64 // when the current state was last logged
	stale     int     // nodes blind while others are not, as last observed
	staleAt   float64 // when that was last logged
	lastEvent atomic.Uint64
}

// current is the reason decisions are blind now, "" when they are not.
func (b *blindness) current() string {
	if r := b.reason.Load(); r != nil {
		return *r
	}
	return ""
}

// observe records the state after a refresh: WARNING on each change and every blindWarnEvery while blind.
func (b *blindness) observe(reason string, onMissing string, now float64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	before := b.current()
	b.reason.Store(&reason)
	switch {
	case reason != "" && (before == "" || now-b.warned >= blindWarnEvery):
		klog.Warningf("GPUScore: decisions use no GPU metrics (onMissingMetrics %s): %s", onMissing, reason)
		b.warned = now
	case reason == "" && before != "":
		klog.Warningf("GPUScore: decisions use GPU metrics again")
	}
	if reason != "" {
		metricsBlind.Set(1)
	} else {
		metricsBlind.Set(0)
	}
}

// observeStale records the nodes blind while others are not (staleNodes) after a refresh that left the fleet
// not blind: WARNING when their count changes and every blindWarnEvery while it lasts, and when it ends.
func (b *blindness) observeStale(count int, description string, of int, onMissing string, now float64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case count > 0 && (count != b.stale || now-b.staleAt >= blindWarnEvery):
		klog.Warningf("GPUScore: decisions use no GPU metrics for %d of %d nodes (onMissingMetrics %s): %s", count, of, onMissing, description)
		b.staleAt = now
	case count == 0 && b.stale > 0:
		klog.Warningf("GPUScore: every node's GPU metrics are within metricsMaxAgeSeconds again")
	}
	b.stale = count
	metricsStaleNodes.Set(float64(count))
}

// eventDue says whether a pod placed now should carry a Warning event (one per blindWarnEvery at most).
func (b *blindness) eventDue(now float64) bool {
	last := b.lastEvent.Load()
	if last != 0 && now-math.Float64frombits(last) < blindWarnEvery {
		return false
	}
	return b.lastEvent.CompareAndSwap(last, math.Float64bits(now))
}

// BlindEventDue says whether a pod placed now, while blind, gets the Warning event (at most one per blindWarnEvery).
func (r *Refresher) BlindEventDue(now float64) bool { return r.blind.eventDue(now) }
