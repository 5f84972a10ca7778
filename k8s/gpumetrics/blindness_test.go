package gpumetrics

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/gpufleet/mig/k8s/gpumetrics/metricstest"
	"github.com/gpufleet/mig/k8s/gpuscore"

	"k8s.io/component-base/metrics/testutil"
)

func TestBlindReasonNamesNoDataAndDataAgedOut(t *testing.T) {
	policy := &gpuscore.Policy{MaxAgeSeconds: 30}
	if got := BlindReason(&gpuscore.Snapshot{Nodes: map[string]*gpuscore.NodeMetrics{}}, policy, 100, "timeout"); got != "no GPU metrics loaded; last refresh: timeout" {
		t.Errorf("empty: %q", got)
	}
	snapshot := metricstest.Fleet(60, map[string][]float64{"a": {0.1}})
	snapshot.NewestSample = 60
	if got := BlindReason(snapshot, policy, 90, ""); got != "" {
		t.Errorf("30 s old against 30 s is still fresh: %q", got)
	}
	if got := BlindReason(snapshot, policy, 100, ""); got != "the newest GPU sample is 40s old (metricsMaxAgeSeconds 30)" {
		t.Errorf("aged out: %q", got)
	}
	if got := BlindReason(snapshot, &gpuscore.Policy{}, 1e9, ""); got != "" {
		t.Errorf("maxAge 0 never ages: %q", got)
	}
}

// A source that fails leaves the refresher blind, the gauge at 1 and the failures counted; an answer ends it.
func TestRefresherReportsBlindnessInItsMetric(t *testing.T) {
	registerMetricsOnce()
	source := &metricstest.Source{Err: errors.New("Prometheus did not answer both queries within prometheusTimeoutSeconds (2s)")}
	args := gpuscore.DefaultArgs()
	r := NewRefresher(source, 1, args.Policy())
	failuresBefore, _ := testutil.GetCounterMetricValue(refreshFailures)
	r.RefreshOnce(context.Background())
	if reason := r.BlindReason(); !strings.HasPrefix(reason, "no GPU metrics loaded; last refresh: Prometheus did not answer") {
		t.Errorf("reason: %q", reason)
	}
	if value, _ := testutil.GetGaugeMetricValue(metricsBlind); value != 1 {
		t.Errorf("scheduler_gpuscore_metrics_blind = %v while blind", value)
	}
	if failures, _ := testutil.GetCounterMetricValue(refreshFailures); failures != failuresBefore+1 {
		t.Errorf("failures %v, want %v", failures, failuresBefore+1)
	}
	source.Err = nil
	source.Snapshot = metricstest.Fleet(Now(), map[string][]float64{"a": {0.1}})
	source.Snapshot.NewestSample = Now()
	r.RefreshOnce(context.Background())
	if reason := r.BlindReason(); reason != "" {
		t.Errorf("fresh data, still blind: %q", reason)
	}
	if value, _ := testutil.GetGaugeMetricValue(metricsBlind); value != 0 {
		t.Errorf("scheduler_gpuscore_metrics_blind = %v with fresh data", value)
	}
}

func TestBlindEventsAreRateLimited(t *testing.T) {
	var b blindness
	if !b.eventDue(1000) || b.eventDue(1000+blindWarnEvery-1) || !b.eventDue(1000+blindWarnEvery) {
		t.Error("one event per blindWarnEvery")
	}
}

// One node behind while the others are fresh: counted and named, not blind; the whole snapshot stale is BlindReason's.
func TestStaleNodesCountsNodesAgedOutWhileOthersAreFresh(t *testing.T) {
	policy := &gpuscore.Policy{MaxAgeSeconds: 30}
	snapshot := metricstest.Fleet(100, map[string][]float64{"a": {0.1}, "b": {0.1}, "c": {0.1}, "d": {0.1}, "e": {0.1}, "f": {0.1}, "g": {0.1}})
	snapshot.NewestSample = 100
	if count, _ := staleNodes(snapshot, policy, 110); count != 0 {
		t.Errorf("all fresh: %d stale", count)
	}
	for _, name := range []string{"g", "b", "f", "a", "e", "d"} {
		snapshot.Nodes[name].SampleTime = 60
	}
	snapshot.Nodes["d"].SampleTime = 55
	count, description := staleNodes(snapshot, policy, 100)
	want := "samples older than metricsMaxAgeSeconds 30 (the oldest 45s) on a, b, d, e, f and 1 more"
	if count != 6 || description != want {
		t.Errorf("got %d %q, want 6 %q", count, description, want)
	}
	if count, _ := staleNodes(snapshot, policy, 131); count != 0 {
		t.Errorf("the whole snapshot stale is blindness, not %d stale nodes", count)
	}
	if count, _ := staleNodes(snapshot, &gpuscore.Policy{}, 1e9); count != 0 {
		t.Errorf("maxAge 0 never ages: %d", count)
	}
}

func TestRefresherReportsStaleNodesInItsMetric(t *testing.T) {
	registerMetricsOnce()
	now := Now()
	source := &metricstest.Source{Snapshot: metricstest.Fleet(now, map[string][]float64{"fresh": {0.1}, "behind": {0.95}})}
	source.Snapshot.Nodes["behind"].SampleTime = now - 45
	source.Snapshot.NewestSample = now
	args := gpuscore.DefaultArgs()
	r := NewRefresher(source, 1, args.Policy())
	r.RefreshOnce(context.Background())
	if value, _ := testutil.GetGaugeMetricValue(metricsStaleNodes); value != 1 {
		t.Errorf("scheduler_gpuscore_metrics_stale_nodes = %v with one node 45 s old", value)
	}
	if reason := r.BlindReason(); reason != "" {
		t.Errorf("one stale node is not blindness: %q", reason)
	}
	source.Snapshot = metricstest.Fleet(Now(), map[string][]float64{"fresh": {0.1}, "behind": {0.95}})
	source.Snapshot.NewestSample = Now()
	r.RefreshOnce(context.Background())
	if value, _ := testutil.GetGaugeMetricValue(metricsStaleNodes); value != 0 {
		t.Errorf("scheduler_gpuscore_metrics_stale_nodes = %v once every node is fresh", value)
	}
}
