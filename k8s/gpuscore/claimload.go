package gpuscore

// The load half of GPUClaimScore (claims.go): scoring.py's claim_load_verdict and claim_score, checked through the
// "claims" section of testdata/vectors.json. The rule is GPUScore's own (evaluateNode); only the request differs.

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"

	"k8s.io/apimachinery/pkg/runtime"
	fwk "k8s.io/kube-scheduler/framework"
)

// ClaimLoadResource names the pool of a node's devices a DRA claim is judged by (scoring.CLAIM_LOAD_RESOURCE):
// a claim asks for no extended resource, and with DynamicMIG its instance does not exist before the allocation.
const ClaimLoadResource = "gpufleet.io/dra-node-devices"

// ClaimLoadWeight is the score points a node loses per load point below MaxScore (scoring.CLAIM_LOAD_WEIGHT).
const ClaimLoadWeight = 5

// ClaimLoadVerdict is GPUScore's verdict on node for a DRA claim: every device of the node (whole GPUs and MIG
// instances, in the snapshot's resource order) pooled into one request for all of them.
func ClaimLoadVerdict(node string, metrics *NodeMetrics, p *Policy, now float64, modes map[string]Mode, reasons bool) Verdict {
	if metrics == nil {
		return evaluateNode(node, nil, []ResourceRequest{{ClaimLoadResource, 1}}, p, now, nil, modes, reasons)
	}
	resources := metrics.Resources
	if resources == nil {
		resources = sortedKeys(metrics.Devices)
	}
	var devices []Device
	for _, resource := range resources {
		devices = append(devices, metrics.Devices[resource]...)
	}
	pooled := &NodeMetrics{
		Name:       metrics.Name,
		SampleTime: metrics.SampleTime,
		Devices:    map[string][]Device{ClaimLoadResource: devices},
		Resources:  []string{ClaimLoadResource},
	}
	return evaluateNode(node, pooled, []ResourceRequest{{ClaimLoadResource, len(devices)}}, p, now, nil, modes, reasons)
}

// ClaimNodeScore is scoring.claim_score: the placement score (0..100) less ClaimLoadWeight per load point below
// MaxScore, 0 when the load verdict fails (a hot node, or missing metrics under onMissingMetrics deny).
func ClaimNodeScore(placement int64, load Verdict) int64 {
	if !load.Passed {
		return int64(fwk.MinNodeScore)
	}
	score := placement - ClaimLoadWeight*int64(MaxScore-load.Score)
	return max(int64(fwk.MinNodeScore), min(int64(fwk.MaxNodeScore), score))
}

// One Refresher per distinct args in the process: GPUScore and GPUClaimScore in gpufleet-scheduler's profile read
// the same snapshot instead of polling Prometheus twice.
var (
	refreshersMu sync.Mutex
	refreshers   = map[string]*Refresher{}
)

// sharedRefresher is the running Refresher for args, started (one poll, then the background loop) on first use.
// source polls Prometheus for the first plugin built with args (prometheusSourceFor); a later one's is dropped.
func sharedRefresher(ctx context.Context, args Args, source Source) *Refresher {
	key, err := json.Marshal(args)
	if err != nil { // Args is plain data; cannot happen, but never share on a bad key
		key = nil
	}
	refreshersMu.Lock()
	defer refreshersMu.Unlock()
	if r, ok := refreshers[string(key)]; ok && key != nil {
		return r
	}
	r := NewRefresher(source, seconds(args.MetricsRefreshSeconds), args.Policy())
	r.RefreshOnce(ctx) // one poll before the first pod, as the extender does before serving
	go r.Run(ctx)
	if key != nil {
		refreshers[string(key)] = r
	}
	return r
}

// prometheusSourceFor is the Prometheus source args describe: its CA pinned (read now: an unreadable file is an
// args problem), its bearer token file re-read at each refresh, and the form it reads (prometheusQuery).
func prometheusSourceFor(args Args) (*PrometheusSource, error) {
	source := NewPrometheusSource(args.PrometheusURL, args.NodeNameLabels, seconds(args.PrometheusTimeoutSeconds),
		args.MetricsMaxClockSkewSeconds, ExporterMatchers(args.ExporterJob, args.ExporterNamespace))
	if args.PrometheusCAFile != "" {
		if err := source.PinCA(args.PrometheusCAFile); err != nil {
			return nil, err
		}
	}
	source.UseTokenFile(args.PrometheusTokenFile)
	if args.PrometheusQuery == QueryRecorded {
		source.UseRecorded()
	}
	return source, nil
}

// startMetrics parses a plugin's args (GPUScore's, for both plugins) and returns them with the Refresher they
// share. The CA file is read here, at start, and its problem listed with the others: a scheduler that would query
// Prometheus unpinned, or not at all, does not start.
func startMetrics(ctx context.Context, obj runtime.Object, plugin string) (Args, *Refresher, error) {
	args, problems := ParseArgs(obj)
	source, err := prometheusSourceFor(args)
	if err != nil {
		problems = append(problems, err.Error())
	}
	if err := joined(problems); err != nil {
		return args, nil, fmt.Errorf("invalid %s args: %w", plugin, err)
	}
	RegisterMetrics()
	return args, sharedRefresher(ctx, args, source), nil // polled once already, then in the background
}
