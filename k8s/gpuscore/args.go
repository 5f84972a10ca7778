package gpuscore

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"reflect"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"
)

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
	// PROMETHEUS_QUERY: recorded (the dcgm_exporter role's recording rules, one series per device) | raw.
	PrometheusQuery string `json:"prometheusQuery"`
}

// maxReplicas bounds SHARED_RESOURCES' replicas (the settings contract's range, as the extender's).
const maxReplicas = 64

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
		PrometheusQuery:            QueryRaw,
	}
}

// ParseArgs decodes and validates the plugin's args (nil: all defaults) and returns every problem, in the words
// of the extender's check (gpufleet-extender check-config --plugin-args, which the kube_scheduler role runs before
// deploying): an unknown name or a JSON value of the wrong type is one problem each (that argument keeps its
// default), then every rule of Validate.
func ParseArgs(obj runtime.Object) (Args, []string) {
	args, problems := readArgs(obj)
	return args, append(problems, args.problems()...)
}

// DecodeArgs reads the plugin's args (nil: all defaults) strictly: an unknown or mistyped field is an error,
// so a typo does not silently fall back to a default. The error lists every such field.
func DecodeArgs(obj runtime.Object) (Args, error) {
	args, problems := readArgs(obj)
	return args, joined(problems)
}

func readArgs(obj runtime.Object) (Args, []string) {
	args := DefaultArgs()
	if obj == nil {
		return args, nil
	}
	unknown, ok := obj.(*runtime.Unknown)
	if !ok {
		return args, []string{fmt.Sprintf("want args of type runtime.Unknown, got %T", obj)}
	}
	raw := unknown.Raw
	if len(raw) == 0 {
		return args, nil
	}
	if unknown.ContentType == runtime.ContentTypeYAML {
		converted, err := yaml.YAMLToJSON(raw)
		if err != nil {
			return args, []string{err.Error()}
		}
		raw = converted
	}
	return args, decodeStrict(raw, &args)
}

// argKinds: the JSON type each Go field type decodes from, as the problems say it (plugin_args.py's words).
var argKinds = map[reflect.Type]string{
	reflect.TypeOf(0.0):              "a number",
	reflect.TypeOf(""):               "a string",
	reflect.TypeOf(Strategy("")):     "a string",
	reflect.TypeOf(false):            "true or false",
	reflect.TypeOf([]string{}):       "a list of strings",
	reflect.TypeOf(map[string]int{}): "a mapping of resource name to whole replicas",
}

// decodeStrict decodes each argument on its own, so that every unknown name and every mistyped value is reported
// (encoding/json stops at the first). A JSON null is what encoding/json makes of it: an empty list or mapping, the
// default for the others.
func decodeStrict(raw []byte, into *Args) []string {
	var fields map[string]json.RawMessage
	decoder := json.NewDecoder(bytes.NewReader(raw))
	if err := decoder.Decode(&fields); err != nil {
		var syntax *json.SyntaxError
		if errors.As(err, &syntax) {
			return []string{err.Error()}
		}
		return []string{"args must be a mapping of argument name to value"}
	}
	if decoder.More() {
		return []string{"unexpected data after the args object"}
	}
	targets := map[string]reflect.Value{}
	value := reflect.ValueOf(into).Elem()
	for i := 0; i < value.NumField(); i++ {
		name, _, _ := strings.Cut(value.Type().Field(i).Tag.Get("json"), ",")
		targets[name] = value.Field(i)
	}
	var problems []string
	for _, name := range sortedKeys(fields) {
		target, known := targets[name]
		if !known {
			problems = append(problems, name+": unknown argument")
			continue
		}
		if string(bytes.TrimSpace(fields[name])) == "null" {
			if kind := target.Kind(); kind == reflect.Slice || kind == reflect.Map {
				target.Set(reflect.Zero(target.Type()))
			}
			continue
		}
		decoded := reflect.New(target.Type())
		if err := json.Unmarshal(fields[name], decoded.Interface()); err != nil {
			problems = append(problems, fmt.Sprintf("%s: must be %s", name, argKinds[target.Type()]))
			continue
		}
		target.Set(decoded.Elem())
	}
	return problems
}

// Validate applies the extender's Settings rules; the error lists every problem.
func (a *Args) Validate() error { return joined(a.problems()) }

func joined(problems []string) error {
	if len(problems) == 0 {
		return nil
	}
	return errors.New(strings.Join(problems, "; "))
}

// problems are the extender's Settings rules in its own words (plugin_args.py): each field on its own, then each
// rule between fields whose fields are all valid, so that one pass shows every problem.
func (a *Args) problems() []string {
	var problems []string
	invalid := map[string]bool{}
	bad := func(field, format string, values ...any) {
		invalid[field] = true
		problems = append(problems, fmt.Sprintf(format, values...))
	}
	inRange := func(name string, value, low, high float64, lowOpen, highOpen bool) {
		if math.IsNaN(value) || (lowOpen && value <= low) || (!lowOpen && value < low) ||
			(highOpen && value >= high) || (!highOpen && value > high) {
			left, right := "[", "]"
			if lowOpen {
				left = "("
			}
			if highOpen {
				right = ")"
			}
			bad(name, "%s: %g is not in %s%g, %g%s", name, value, left, low, high, right)
		}
	}
	if !strings.HasPrefix(a.PrometheusURL, "http://") && !strings.HasPrefix(a.PrometheusURL, "https://") {
		bad("prometheusURL", "prometheusURL: must start with http:// or https:// (got %q)", a.PrometheusURL)
	}
	inRange("prometheusTimeoutSeconds", a.PrometheusTimeoutSeconds, 0, 60, true, false)
	inRange("gpuUtilThreshold", a.GPUUtilThreshold, 0, 1, true, false)
	inRange("memUtilThreshold", a.MemUtilThreshold, 0, 1, true, false)
	inRange("weightGPUUtil", a.WeightGPUUtil, 0, 1, false, false)
	inRange("weightMemUtil", a.WeightMemUtil, 0, 1, false, false)
	inRange("metricsRefreshSeconds", a.MetricsRefreshSeconds, 0, 3600, true, false)
	inRange("metricsMaxAgeSeconds", a.MetricsMaxAgeSeconds, 0, math.Inf(1), false, false)
	inRange("metricsMaxClockSkewSeconds", a.MetricsMaxClockSkewSeconds, 0, math.Inf(1), false, false)
	inRange("inflightMaxSeconds", a.InflightMaxSeconds, 0, math.Inf(1), true, false)
	inRange("packTargetUtil", a.PackTargetUtil, 0, 1, true, true)
	inRange("autoPackBelow", a.AutoPackBelow, 0, 1, true, true)
	inRange("autoHysteresis", a.AutoHysteresis, 0, 1, false, true)
	inRange("interferenceWeight", a.InterferenceWeight, 0, 10, false, false)
	inRange("sharedMemFreeMin", a.SharedMemFreeMin, 0, 1, false, true)
	var wrongNames []string
	for _, resource := range sortedKeys(a.SharedResources) {
		if resource != WholeGPUResource && !strings.HasPrefix(resource, MIGResourcePrefix) {
			wrongNames = append(wrongNames, resource)
		}
		if replicas := a.SharedResources[resource]; replicas < 1 || replicas > maxReplicas {
			bad("sharedResources", "sharedResources: %s: %d replicas is not in [1, %d]", resource, replicas, maxReplicas)
		}
	}
	// As the extender: the names are judged once every entry's replicas are.
	if len(wrongNames) > 0 && !invalid["sharedResources"] {
		bad("sharedResources", "sharedResources: names nvidia.com/gpu or nvidia.com/mig-<profile> resources, got %s",
			strings.Join(wrongNames, ", "))
	}
	if a.OnMissingMetrics != "allow" && a.OnMissingMetrics != "deny" {
		bad("onMissingMetrics", "onMissingMetrics: must be allow or deny (got %q)", a.OnMissingMetrics)
	}
	if len(a.NodeNameLabels) == 0 {
		bad("nodeNameLabels", "nodeNameLabels: needs at least one label name, e.g. Hostname,hostname")
	}
	switch a.ScoringStrategy {
	case StrategySpread, StrategyPack, StrategyAuto:
	default:
		bad("scoringStrategy", "scoringStrategy: must be spread, pack or auto (got %q)", a.ScoringStrategy)
	}
	if a.PrometheusQuery != QueryRecorded && a.PrometheusQuery != QueryRaw {
		bad("prometheusQuery", "prometheusQuery: must be recorded or raw (got %q)", a.PrometheusQuery)
	}
	valid := func(fields ...string) bool {
		for _, field := range fields {
			if invalid[field] {
				return false
			}
		}
		return true
	}
	// The rules between fields, each once its fields are valid.
	// The score is 10 x (1 - load); load stays in 0..1 only when the weights add up to 1.
	if total := a.WeightGPUUtil + a.WeightMemUtil; valid("weightGPUUtil", "weightMemUtil") && math.Abs(total-1) > 1e-6 {
		problems = append(problems, fmt.Sprintf("weightGPUUtil + weightMemUtil must be 1.0 (got %g + %g = %.6g)",
			a.WeightGPUUtil, a.WeightMemUtil, total))
	}
	// Packing aims below the filter's threshold, or it would rank highest the nodes about to be refused.
	if valid("scoringStrategy", "packTargetUtil", "gpuUtilThreshold") && a.ScoringStrategy != StrategySpread &&
		a.PackTargetUtil >= a.GPUUtilThreshold {
		problems = append(problems, fmt.Sprintf("packTargetUtil (%g) must be below gpuUtilThreshold (%g) with scoringStrategy=%s",
			a.PackTargetUtil, a.GPUUtilThreshold, a.ScoringStrategy))
	}
	if valid("scoringStrategy", "autoPackBelow", "autoHysteresis") && a.ScoringStrategy == StrategyAuto &&
		a.AutoPackBelow+a.AutoHysteresis >= 1 {
		problems = append(problems, fmt.Sprintf("autoPackBelow + autoHysteresis must be below 1 (got %g + %g): auto would never spread",
			a.AutoPackBelow, a.AutoHysteresis))
	}
	// A CA pins an https certificate; over http there is none to check, and the pin would only look like one.
	if valid("prometheusURL") && a.PrometheusCAFile != "" && !strings.HasPrefix(a.PrometheusURL, "https://") {
		problems = append(problems, fmt.Sprintf("prometheusCAFile needs an https:// prometheusURL (got %q)", a.PrometheusURL))
	}
	return problems
}

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

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for key := range m {
		keys = append(keys, key)
	}
	sort.Strings(keys)
	return keys
}
