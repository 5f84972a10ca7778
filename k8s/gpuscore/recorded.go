package gpuscore

import "math"

// The recorded form (prometheusQuery: recorded), as the extender's metrics_source: the dcgm_exporter role's
// recording rules (metrics_source.recording_rules, the one specification) precompute one series per device and
// one sample time per node in Prometheus' rule evaluation; a refresh reads those two, since Prometheus' answer
// costs per series.
const (
	QueryRecorded = "recorded"
	QueryRaw      = "raw"

	packedSeries         = "gpufleet:dcgm_device:packed"
	nodeSampleTimeSeries = "gpufleet:dcgm_node_sample_time:seconds"
	// sampleTimeMetric is the one metric every device reports: a node's sample time is its newest timestamp.
	sampleTimeMetric = metricFBFree

	// The packed value, decimal fixed point: util permille x utilScale + memory-used permille x memoryScale + pods.
	utilScale     = 10_000_000
	memoryScale   = 1_000
	memoryUnknown = 1001 // no framebuffer metrics, or a total of 0
	podsUnknown   = 999  // no series of the device carried a pod label
)

// RecordedQueries is metrics_source.recorded_queries: the rules pinned the exporter's job and namespace already.
func RecordedQueries() (series, times string) { return packedSeries, nodeSampleTimeSeries }

// RecordedEvaluationQuery is metrics_source.RECORDED_EVALUATION_QUERY: when the rule group last wrote its last
// rule, one number. The recorded series change only when the group is evaluated (every scrape interval, and at
// thousands of nodes the evaluation itself takes longer than a refresh), so a refresh asks this first and reads
// the fleet's series only when the answer moved.
const RecordedEvaluationQuery = "max(timestamp(" + nodeSampleTimeSeries + "))"

// UseRecorded makes the source read the recorded form instead of the raw dcgm series.
func (p *PrometheusSource) UseRecorded() {
	p.seriesQuery, p.timesQuery = RecordedQueries()
	p.recorded = true
}

// evaluationOf is the probe's answer as Prometheus wrote it ("" for an empty vector: no recorded series yet).
func evaluationOf(probe []promSample) string {
	if len(probe) != 1 || len(probe[0].Value) != 2 {
		return ""
	}
	return string(probe[0].Value[1])
}

// decodePacked is metrics_source.decode_packed: one packed series as the samples BuildSnapshot folds (the
// utilisation as GR_ENGINE_ACTIVE carrying the pod count, the memory as FB_USED/FB_FREE in permille). A value
// NaN, not a whole number or with a part out of range decodes as a NaN utilisation, which screenSamples turns into
// the node left out.
func decodePacked(labels map[string]string, value float64) []Sample {
	util, memory, pods := int64(-1), int64(-1), int64(-1)
	// 2^53: every whole number below is exact; the largest the rule writes is about 1e10.
	if !math.IsNaN(value) && value >= 0 && value < 1<<53 && value == math.Trunc(value) {
		packed := int64(value)
		util, memory, pods = packed/utilScale, packed%utilScale/memoryScale, packed%memoryScale
	}
	if !(util >= 0 && util <= 1000 && ((memory >= 0 && memory <= 1000) || memory == memoryUnknown) &&
		pods >= 0 && pods <= podsUnknown) {
		return []Sample{{Name: metricGREngineActive, Labels: labels, Value: math.NaN()}}
	}
	first := Sample{Name: metricGREngineActive, Labels: labels, Value: float64(util) / 1000}
	if pods != podsUnknown {
		first.Pods, first.HasPods = int(pods), true
	}
	samples := []Sample{first}
	if memory != memoryUnknown {
		samples = append(samples,
			Sample{Name: metricFBUsed, Labels: labels, Value: float64(memory)},
			Sample{Name: metricFBFree, Labels: labels, Value: float64(1000 - memory)})
	}
	return samples
}

// buildFromRecorded is metrics_source.PrometheusSource._build reading the recorded form.
func buildFromRecorded(series, times []promSample, nodeLabels []string, queriedAt, now, maxSkew float64, version uint64) *Snapshot {
	samples := make([]Sample, 0, 3*len(series))
	for _, item := range series {
		if v, ok := item.value(); ok {
			samples = append(samples, decodePacked(item.Metric, v)...)
		}
	}
	return buildFromSamples(samples, times, nodeLabels, queriedAt, now, maxSkew, version)
}
