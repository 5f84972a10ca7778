package gpuscore

import "maps"

// Args are GPUScore's pluginConfig args: the seed's prometheusURL, weightGPUUtil and weightMemUtil plus the
// extender's other settings under the same meaning (extender setting in brackets; defaults are the extender's).
type Args struct {
	PrometheusURL            string  `json:"prometheusURL"`            // PROMETHEUS_URL
	PrometheusTimeoutSeconds float64 `json:"prometheusTimeoutSeconds"` // PROMETHEUS_TIMEOUT_SECONDS
	// PROMETHEUS_CA_FILE: PEM CA that Prometheus' certificate must chain to, the only one trusted (https only;
	// "": the system's CAs). Read once at start: an unreadable file or one without a certificate stops the scheduler.
	PrometheusCAFile string `json:"prometheusCAFile"`
	// PROMETHEUS_TOKEN_FILE: file holding the bearer token sent with every query, re-read at each refresh so that a
	// rotated token (a Secret the kubelet updates in place) is used without a restart ("": no token).
	PrometheusTokenFile string `json:"prometheusTokenFile"`
	// EXPORTER_JOB, EXPORTER_NAMESPACE: dcgm series only from this scrape job and namespace ("": any).
	ExporterJob           string  `json:"exporterJob"`
	ExporterNamespace     string  `json:"exporterNamespace"`
	GPUUtilThreshold      float64 `json:"gpuUtilThreshold"`      // GPU_UTIL_THRESHOLD: filter at or above
	MemUtilThreshold      float64 `json:"memUtilThreshold"`      // MEM_UTIL_THRESHOLD
	WeightGPUUtil         float64 `json:"weightGPUUtil"`         // WEIGHT_GPU_UTIL
	WeightMemUtil         float64 `json:"weightMemUtil"`         // WEIGHT_MEM_UTIL
	MetricsRefreshSeconds float64 `json:"metricsRefreshSeconds"` // METRICS_REFRESH_SECONDS
	MetricsMaxAgeSeconds  float64 `json:"metricsMaxAgeSeconds"`  // METRICS_MAX_AGE_SECONDS (0: never stale)
	// METRICS_MAX_CLOCK_SKEW_SECONDS: a node whose samples are dated further ahead counts as without metrics.
	MetricsMaxClockSkewSeconds float64  `json:"metricsMaxClockSkewSeconds"`
	OnMissingMetrics           string   `json:"onMissingMetrics"`   // ON_MISSING_METRICS: allow | deny
	NodeNameLabels             []string `json:"nodeNameLabels"`     // NODE_NAME_LABELS
	TenantLabel                string   `json:"tenantLabel"`        // TENANT_LABEL
	TenantPools                bool     `json:"tenantPools"`        // TENANT_POOLS
	InflightMaxSeconds         float64  `json:"inflightMaxSeconds"` // INFLIGHT_MAX_SECONDS
	ScoringStrategy            Strategy `json:"scoringStrategy"`    // SCORING_STRATEGY: spread | pack | auto
	PackTargetUtil             float64  `json:"packTargetUtil"`     // PACK_TARGET_UTIL
	AutoPackBelow              float64  `json:"autoPackBelow"`      // AUTO_PACK_BELOW
	AutoHysteresis             float64  `json:"autoHysteresis"`     // AUTO_HYSTERESIS
	// SHARED_RESOURCES: time-sliced resources and their replicas per device, as the device plugin's sharing
	// config says ({"nvidia.com/mig-1g.10gb": 4}); the others are exclusive.
	SharedResources map[string]int `json:"sharedResources"`
	// INTERFERENCE_WEIGHT: under spread, how much the load of a node's other devices lowers an exclusive
	// resource's score (0: not at all).
	InterferenceWeight float64 `json:"interferenceWeight"`
	// SHARED_MEM_FREE_MIN: share of a time-sliced device's memory that must be free on every device the device
	// plugin may hand the pod (0: off).
	SharedMemFreeMin float64 `json:"sharedMemFreeMin"`
	// METRICS_SOURCE: prometheus (queried every refresh) | push (Prometheus' remote write to the scheduler's own
	// receiver, k8s/gpumetrics/remotewrite).
	MetricsSource string `json:"metricsSource"`
	// REMOTE_WRITE_ADDRESS: host:port the receiver listens on (push only; no host: every interface).
	RemoteWriteAddress string `json:"remoteWriteAddress"`
	// REMOTE_WRITE_TOKEN_FILE: the bearer token a sender must present, re-read when the file changes (push needs it).
	RemoteWriteTokenFile string `json:"remoteWriteTokenFile"`
	// REMOTE_WRITE_CERT_FILE, REMOTE_WRITE_KEY_FILE: the PEM pair the receiver serves https with (both or neither;
	// neither: plain http).
	RemoteWriteCertFile string `json:"remoteWriteCertFile"`
	RemoteWriteKeyFile  string `json:"remoteWriteKeyFile"`
}

// The metrics sources (metricsSource).
const (
	SourcePrometheus = "prometheus"
	SourcePush       = "push"
)

// maxReplicas bounds SHARED_RESOURCES' replicas (the settings contract's range, as the extender's).
const maxReplicas = 64

// Policy is the decision policy these args describe.
func (a *Args) Policy() Policy {
	return Policy{
		GPUUtilThreshold: a.GPUUtilThreshold,
		MemUtilThreshold: a.MemUtilThreshold,
		WeightGPUUtil:    a.WeightGPUUtil,
		WeightMemUtil:    a.WeightMemUtil,
		MaxAgeSeconds:    a.MetricsMaxAgeSeconds,
		DenyMissing:      a.OnMissingMetrics == "deny",
		Strategy:         a.ScoringStrategy,
		PackTargetUtil:   a.PackTargetUtil,
		AutoPackBelow:    a.AutoPackBelow,
		AutoHysteresis:   a.AutoHysteresis,
		// Replicas 1 is an exclusive device: only resources with more are judged the shared way.
		SharedResources:    maps.Clone(a.SharedResources),
		InterferenceWeight: a.InterferenceWeight,
		SharedMemFreeMin:   a.SharedMemFreeMin,
	}
}
