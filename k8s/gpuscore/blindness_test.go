package gpuscore

import (
	"context"
	"errors"
	"strings"
	"testing"

	"k8s.io/component-base/metrics/testutil"
)

func TestBlindReasonNamesNoDataAndDataAgedOut(t *testing.T) {
	policy := &Policy{MaxAgeSeconds: 30}
	if got := BlindReason(&Snapshot{Nodes: map[string]*NodeMetrics{}}, policy, 100, "timeout"); got != "no GPU metrics loaded; last refresh: timeout" {
		t.Errorf("empty: %q", got)
	}
	snapshot := fleet(60, map[string][]float64{"a": {0.1}})
	snapshot.NewestSample = 60
	if got := BlindReason(snapshot, policy, 90, ""); got != "" {
		t.Errorf("30 s old against 30 s is still fresh: %q", got)
	}
	if got := BlindReason(snapshot, policy, 100, ""); got != "the newest GPU sample is 40s old (metricsMaxAgeSeconds 30)" {
		t.Errorf("aged out: %q", got)
	}
	if got := BlindReason(snapshot, &Policy{}, 1e9, ""); got != "" {
		t.Errorf("maxAge 0 never ages: %q", got)
	}
}

// A source that fails leaves the refresher blind, the gauge at 1 and the failures counted; an answer ends it.
func TestRefresherReportsBlindnessInItsMetric(t *testing.T) {
	RegisterMetrics()
	source := &fakeSource{err: errors.New("Prometheus did not answer both queries within prometheusTimeoutSeconds (2s)")}
	args := DefaultArgs()
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
	source.err = nil
	source.snapshot = fleet(nowSeconds(), map[string][]float64{"a": {0.1}})
	source.snapshot.NewestSample = nowSeconds()
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
