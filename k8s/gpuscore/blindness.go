package gpuscore

// Blindness: when decisions use no GPU metrics at all (none loaded yet, or the newest sample older than
// metricsMaxAgeSeconds), GPUScore places like a scheduler that knows nothing (onMissingMetrics allow) or places
// nothing (deny). Either way operators must see it: the scheduler metric scheduler_gpuscore_metrics_blind, a
// WARNING log line on each change and every blindWarnEvery while it lasts, and a Warning event (reason
// GPUMetricsBlind) on the pods placed blind, at most one per blindWarnEvery. The extender does the same
// (service.Extender.blind_reason, /readyz's metrics_blind).

import (
	"fmt"
	"math"
	"sync"
	"sync/atomic"

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
	registerMetrics sync.Once
)

// RegisterMetrics adds GPUScore's metrics to the scheduler's /metrics (once per process).
func RegisterMetrics() {
	registerMetrics.Do(func() { legacyregistry.MustRegister(metricsBlind, refreshFailures) })
}

// BlindReason says why decisions use no metrics at now ("" while they use some): no node in the snapshot, or its
// newest sample older than the policy's maximum age; lastError is the source's last failure, if any.
func BlindReason(s *Snapshot, p *Policy, now float64, lastError string) string {
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

// blindness is the refresher's record of it: the current reason (read by PreFilter without a lock) and when it
// was last logged and last shown on a pod.
type blindness struct {
	reason    atomic.Pointer[string]
	mu        sync.Mutex
	warned    float64 // when the current state was last logged
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

// eventDue says whether a pod placed now should carry a Warning event (one per blindWarnEvery at most).
func (b *blindness) eventDue(now float64) bool {
	last := b.lastEvent.Load()
	if last != 0 && now-math.Float64frombits(last) < blindWarnEvery {
		return false
	}
	return b.lastEvent.CompareAndSwap(last, math.Float64bits(now))
}
