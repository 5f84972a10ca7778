package gpuscore

// The load half of GPUClaimScore (k8s/plugins/gpuclaimscore): scoring.py's claim_load_verdict and claim_score,
// checked through the "claims" section of testdata/vectors.json. The rule is GPUScore's own (Evaluate); only the
// request differs.

import (
	fwk "k8s.io/kube-scheduler/framework"
)

// claimLoadResource names the pool of a node's devices a DRA claim is judged by (scoring.CLAIM_LOAD_RESOURCE):
// a claim asks for no extended resource, and with DynamicMIG its instance does not exist before the allocation.
const claimLoadResource = "gpufleet.io/dra-node-devices"

// ClaimLoadWeight is the score points a node loses per load point below MaxScore (scoring.CLAIM_LOAD_WEIGHT).
const ClaimLoadWeight = 5

// ClaimLoadVerdict is GPUScore's verdict on node for a DRA claim: every device of the node (whole GPUs and MIG
// instances, in the snapshot's resource order) pooled into one request for all of them.
func ClaimLoadVerdict(node string, metrics *NodeMetrics, p *Policy, now float64, modes map[string]Mode, reasons bool) Verdict {
	if metrics == nil {
		return Evaluate(node, nil, []ResourceRequest{{claimLoadResource, 1}}, p, now, nil, modes, reasons)
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
		Devices:    map[string][]Device{claimLoadResource: devices},
		Resources:  []string{claimLoadResource},
	}
	return Evaluate(node, pooled, []ResourceRequest{{claimLoadResource, len(devices)}}, p, now, nil, modes, reasons)
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
