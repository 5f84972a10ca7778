package gpuscore

// DefaultArgs are the settings contract's defaults (extender/src/gpufleet_extender/settings_contract.json, which the
// extender reads; contract_test.go holds these and Validate's ranges and choices to it).
func DefaultArgs() Args {
	return Args{
		PrometheusURL:              "http://127.0.0.1:9090",
		PrometheusTimeoutSeconds:   2,
		GPUUtilThreshold:           0.8,
		MemUtilThreshold:           0.9,
		WeightGPUUtil:              0.7,
		WeightMemUtil:              0.3,
		MetricsRefreshSeconds:      5,
		MetricsMaxAgeSeconds:       30,
		MetricsMaxClockSkewSeconds: 5,
		OnMissingMetrics:           "allow",
		NodeNameLabels:             []string{"Hostname", "hostname"},
		TenantLabel:                "gpufleet.io/tenant",
		TenantPools:                true,
		InflightMaxSeconds:         120,
		ScoringStrategy:            StrategySpread,
		PackTargetUtil:             0.6,
		AutoPackBelow:              0.4,
		AutoHysteresis:             0.1,
		SharedResources:            map[string]int{},
		InterferenceWeight:         0,
		SharedMemFreeMin:           0,
		MetricsSource:              SourcePrometheus,
		RemoteWriteAddress:         ":9402",
	}
}
