package gpuscore

// The snapshot a Prometheus answer describes, as the extender's metrics_source builds it (the "prometheus"
// section of testdata/vectors.json): the queries, the series they return, and the screening and folding of those
// series into a Snapshot. Asking Prometheus is k8s/gpumetrics' (the client and the Refresher).

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// ExporterMatchers pins series to the exporter's scrape job and namespace: `job="x",namespace="y"` ("" for
// what is not pinned), as the extender's exporter_matchers.
func ExporterMatchers(job, namespace string) string {
	var pinned []string
	if job != "" {
		pinned = append(pinned, "job="+strconv.Quote(job))
	}
	if namespace != "" {
		pinned = append(pinned, "namespace="+strconv.Quote(namespace))
	}
	return strings.Join(pinned, ",")
}

// decisionLabels are the labels a decision reads besides the node's (buildSnapshot), as the extender's
// metrics_source.DECISION_LABELS.
var decisionLabels = []string{"gpu", "UUID", "GPU_I_ID", "GPU_I_PROFILE", "pod", "namespace", "exported_pod", "exported_namespace"}

// DecisionLabels are the labels a decision reads besides the node's (a copy: the receiver of pushed samples keeps
// these and drops the others).
func DecisionLabels() []string { return append([]string(nil), decisionLabels...) }

// DCGMMetrics are the dcgm-exporter metrics a decision reads (a copy).
func DCGMMetrics() []string { return append([]string(nil), dcgmMetrics...) }

// PrometheusQueries is metrics_source.prometheus_queries: the series aggregated by the labels decisions read
// (Prometheus drops the rest before encoding its answer; series two exporters disagree on fold into their
// maximum), and the newest sample time per node, read from one metric every device reports (sampleTimeMetric):
// Prometheus' cost is per series read.
func PrometheusQueries(nodeLabels []string, matchers string) (series, times string) {
	selector, pinned := "", ""
	if matchers != "" {
		selector, pinned = "{"+matchers+"}", ","+matchers
	}
	keep := strings.Join(append(append([]string{"__name__"}, nodeLabels...), decisionLabels...), ", ")
	series = fmt.Sprintf(`max by (%s) ({__name__=~"%s"%s})`, keep, strings.Join(dcgmMetrics, "|"), pinned)
	times = fmt.Sprintf("max by (%s) (timestamp(%s%s))", strings.Join(nodeLabels, ", "), sampleTimeMetric, selector)
	return series, times
}

// Series is one element of an instant vector: {"metric": {...}, "value": [<time>, "<value>"]}.
type Series struct {
	Metric map[string]string `json:"metric"`
	Value  []json.RawMessage `json:"value"`
}

func (s Series) Number() (float64, bool) {
	if len(s.Value) != 2 {
		return 0, false
	}
	var text string
	if json.Unmarshal(s.Value[1], &text) != nil {
		return 0, false
	}
	v, err := strconv.ParseFloat(text, 64)
	return v, err == nil
}

// validRange is the range each metric's values must lie in (percent, ratio, MiB); anything else, NaN included,
// is a broken exporter.
var validRange = map[string][2]float64{
	metricGPUUtil:        {0, 100},
	metricGREngineActive: {0, 1},
	metricFBUsed:         {0, math.Inf(1)},
	metricFBFree:         {0, math.Inf(1)},
}

// screenSamples is metrics_source.screen_samples: a value out of its metric's range makes the whole node's data
// untrustworthy, so all its samples are dropped and the missing-metrics policy decides for it.
func screenSamples(samples []Sample, nodeLabels []string) []Sample {
	bad := map[string]bool{}
	for _, s := range samples {
		node := nodeNameOf(s.Labels, nodeLabels)
		if node == "" {
			continue
		}
		limits, ok := validRange[s.Name]
		if !ok {
			limits = [2]float64{math.Inf(-1), math.Inf(1)}
		}
		if !(limits[0] <= s.Value && s.Value <= limits[1]) {
			bad[node] = true
		}
	}
	if len(bad) == 0 {
		return samples
	}
	kept := samples[:0:0]
	for _, s := range samples {
		if !bad[nodeNameOf(s.Labels, nodeLabels)] {
			kept = append(kept, s)
		}
	}
	return kept
}

// dropFutureNodes is metrics_source.drop_future_nodes: a sample dated beyond now + maxSkew would count as fresh
// until then whatever metricsMaxAgeSeconds says; some clock is wrong, so the node counts as without metrics.
func dropFutureNodes(s *Snapshot, now, maxSkew float64) {
	order := s.Order[:0:0]
	s.NewestSample = 0
	for _, name := range s.Order {
		metrics := s.Nodes[name]
		if metrics.SampleTime > now+maxSkew {
			delete(s.Nodes, name)
			continue
		}
		order = append(order, name)
		if metrics.SampleTime > s.NewestSample || s.NewestSample == 0 {
			s.NewestSample = metrics.SampleTime
		}
	}
	s.Order = order
}

// SnapshotFromSeries is metrics_source.PrometheusSource._build: unparsable values are skipped, nodes with values out
// of range or dated beyond now + maxSkew are left out.
func SnapshotFromSeries(series, times []Series, nodeLabels []string, queriedAt, now, maxSkew float64, version uint64) *Snapshot {
	samples := make([]Sample, 0, len(series))
	for _, item := range series {
		if v, ok := item.Number(); ok {
			samples = append(samples, Sample{Name: item.Metric["__name__"], Labels: item.Metric, Value: v})
		}
	}
	return buildFromSamples(samples, times, nodeLabels, queriedAt, now, maxSkew, version)
}

// buildFromSamples is the rest of metrics_source.PrometheusSource._build:
// the sample times per node, screening, the snapshot, nodes dated beyond now + maxSkew left out.
func buildFromSamples(samples []Sample, times []Series, nodeLabels []string, queriedAt, now, maxSkew float64, version uint64) *Snapshot {
	nodeTimes := map[string]float64{}
	for _, item := range times {
		node := nodeNameOf(item.Metric, nodeLabels)
		stamp, ok := item.Number()
		if node == "" || !ok || math.IsNaN(stamp) || math.IsInf(stamp, 0) {
			continue
		}
		if t, seen := nodeTimes[node]; !seen || stamp > t {
			nodeTimes[node] = stamp
		}
	}
	snapshot := buildSnapshot(screenSamples(samples, nodeLabels), nodeLabels, queriedAt, nodeTimes, version)
	dropFutureNodes(snapshot, now, maxSkew)
	return snapshot
}

// NodeFromSamples is one node's part of buildFromSamples, for a source that keeps samples per node and rebuilds only
// the nodes that changed (the remote-write receiver): samples are all of node's, dated sampleTime; the same
// screening (a value out of its metric's range leaves the node out), nil when nothing of the node is left. Whether
// it is dated too far ahead depends on the clock at publication: SnapshotOfNodes judges that.
func NodeFromSamples(samples []Sample, node string, sampleTime float64, nodeLabels []string) *NodeMetrics {
	built := buildSnapshot(screenSamples(samples, nodeLabels), nodeLabels, sampleTime, map[string]float64{node: sampleTime}, 0)
	return built.Nodes[node]
}

// SnapshotOfNodes is the snapshot numbered version of nodes made by NodeFromSamples, in their order: nodes dated
// beyond now + maxSkew left out, as buildFromSamples does. The NodeMetrics are the caller's, not copied: one already
// ranked (Snapshot.Rank) by an earlier snapshot of the same source keeps its ranking and its memo.
func SnapshotOfNodes(nodes []*NodeMetrics, now, maxSkew float64, version uint64) *Snapshot {
	snapshot := &Snapshot{Nodes: make(map[string]*NodeMetrics, len(nodes)), Order: make([]string, 0, len(nodes)), Version: version}
	for _, metrics := range nodes {
		if _, seen := snapshot.Nodes[metrics.Name]; seen {
			continue
		}
		snapshot.Nodes[metrics.Name] = metrics
		snapshot.Order = append(snapshot.Order, metrics.Name)
	}
	dropFutureNodes(snapshot, now, maxSkew)
	return snapshot
}

// sampleTimeMetric is the one metric every device reports: a node's sample time is its newest timestamp.
const sampleTimeMetric = metricFBFree
