package gpuscore

import (
	"fmt"
	"math"
	"net"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"
)

// ValidateArgs checks args against the extender's Settings rules (the settings contract's ranges and choices, and
// the rules between settings) and returns every error, each with its field path under path (nil: the args' root):
// first each field on its own (field.Invalid, field.Required), then each rule between fields whose fields are all
// valid (field.Forbidden, on the field the rule constrains), so that one pass shows every problem.
func ValidateArgs(path *field.Path, args *Args) field.ErrorList {
	var errs field.ErrorList
	invalid := map[string]bool{}
	child := func(name string) *field.Path {
		if path == nil {
			return field.NewPath(name)
		}
		return path.Child(name)
	}
	bad := func(name string, err *field.Error) {
		invalid[name] = true
		errs = append(errs, err)
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
			bad(name, field.Invalid(child(name), value, fmt.Sprintf("%g is not in %s%g, %g%s", value, left, low, high, right)))
		}
	}
	if !strings.HasPrefix(args.PrometheusURL, "http://") && !strings.HasPrefix(args.PrometheusURL, "https://") {
		bad("prometheusURL", field.Invalid(child("prometheusURL"), args.PrometheusURL,
			fmt.Sprintf("must start with http:// or https:// (got %q)", args.PrometheusURL)))
	}
	inRange("prometheusTimeoutSeconds", args.PrometheusTimeoutSeconds, 0, 60, true, false)
	inRange("gpuUtilThreshold", args.GPUUtilThreshold, 0, 1, true, false)
	inRange("memUtilThreshold", args.MemUtilThreshold, 0, 1, true, false)
	inRange("weightGPUUtil", args.WeightGPUUtil, 0, 1, false, false)
	inRange("weightMemUtil", args.WeightMemUtil, 0, 1, false, false)
	inRange("metricsRefreshSeconds", args.MetricsRefreshSeconds, 0, 3600, true, false)
	inRange("metricsMaxAgeSeconds", args.MetricsMaxAgeSeconds, 0, math.Inf(1), false, false)
	inRange("metricsMaxClockSkewSeconds", args.MetricsMaxClockSkewSeconds, 0, math.Inf(1), false, false)
	inRange("inflightMaxSeconds", args.InflightMaxSeconds, 0, math.Inf(1), true, false)
	inRange("packTargetUtil", args.PackTargetUtil, 0, 1, true, true)
	inRange("autoPackBelow", args.AutoPackBelow, 0, 1, true, true)
	inRange("autoHysteresis", args.AutoHysteresis, 0, 1, false, true)
	inRange("interferenceWeight", args.InterferenceWeight, 0, 10, false, false)
	inRange("sharedMemFreeMin", args.SharedMemFreeMin, 0, 1, false, true)
	var wrongNames []string
	for _, resource := range sortedKeys(args.SharedResources) {
		if resource != WholeGPUResource && !strings.HasPrefix(resource, MIGResourcePrefix) {
			wrongNames = append(wrongNames, resource)
		}
		if replicas := args.SharedResources[resource]; replicas < 1 || replicas > maxReplicas {
			bad("sharedResources", field.Invalid(child("sharedResources").Key(resource), replicas,
				fmt.Sprintf("%d replicas is not in [1, %d]", replicas, maxReplicas)))
		}
	}
	// As the extender: the names are judged once every entry's replicas are.
	if len(wrongNames) > 0 && !invalid["sharedResources"] {
		bad("sharedResources", field.Invalid(child("sharedResources"), wrongNames,
			"names nvidia.com/gpu or nvidia.com/mig-<profile> resources, got "+strings.Join(wrongNames, ", ")))
	}
	if args.OnMissingMetrics != "allow" && args.OnMissingMetrics != "deny" {
		bad("onMissingMetrics", field.Invalid(child("onMissingMetrics"), args.OnMissingMetrics,
			fmt.Sprintf("must be allow or deny (got %q)", args.OnMissingMetrics)))
	}
	if len(args.NodeNameLabels) == 0 {
		bad("nodeNameLabels", field.Required(child("nodeNameLabels"), "needs at least one label name, e.g. Hostname,hostname"))
	}
	switch args.ScoringStrategy {
	case StrategySpread, StrategyPack, StrategyAuto:
	default:
		bad("scoringStrategy", field.Invalid(child("scoringStrategy"), args.ScoringStrategy,
			fmt.Sprintf("must be spread, pack or auto (got %q)", args.ScoringStrategy)))
	}
	if args.MetricsSource != SourcePrometheus && args.MetricsSource != SourcePush {
		bad("metricsSource", field.Invalid(child("metricsSource"), args.MetricsSource,
			fmt.Sprintf("must be prometheus or push (got %q)", args.MetricsSource)))
	}
	if problem := addressProblem(args.RemoteWriteAddress); problem != "" {
		bad("remoteWriteAddress", field.Invalid(child("remoteWriteAddress"), args.RemoteWriteAddress, problem))
	}
	valid := func(fields ...string) bool {
		for _, name := range fields {
			if invalid[name] {
				return false
			}
		}
		return true
	}
	// The rules between fields, each once its fields are valid.
	// The score is 10 x (1 - load); load stays in 0..1 only when the weights add up to 1.
	if total := args.WeightGPUUtil + args.WeightMemUtil; valid("weightGPUUtil", "weightMemUtil") && math.Abs(total-1) > 1e-6 {
		errs = append(errs, field.Forbidden(child("weightMemUtil"), fmt.Sprintf(
			"weightGPUUtil + weightMemUtil must be 1.0 (got %g + %g = %.6g)", args.WeightGPUUtil, args.WeightMemUtil, total)))
	}
	// Packing aims below the filter's threshold, or it would rank highest the nodes about to be refused.
	if valid("scoringStrategy", "packTargetUtil", "gpuUtilThreshold") && args.ScoringStrategy != StrategySpread &&
		args.PackTargetUtil >= args.GPUUtilThreshold {
		errs = append(errs, field.Forbidden(child("packTargetUtil"), fmt.Sprintf(
			"packTargetUtil (%g) must be below gpuUtilThreshold (%g) with scoringStrategy=%s",
			args.PackTargetUtil, args.GPUUtilThreshold, args.ScoringStrategy)))
	}
	if valid("scoringStrategy", "autoPackBelow", "autoHysteresis") && args.ScoringStrategy == StrategyAuto &&
		args.AutoPackBelow+args.AutoHysteresis >= 1 {
		errs = append(errs, field.Forbidden(child("autoHysteresis"), fmt.Sprintf(
			"autoPackBelow + autoHysteresis must be below 1 (got %g + %g): auto would never spread",
			args.AutoPackBelow, args.AutoHysteresis)))
	}
	// A CA pins an https certificate; over http there is none to check, and the pin would only look like one.
	if valid("prometheusURL") && args.PrometheusCAFile != "" && !strings.HasPrefix(args.PrometheusURL, "https://") {
		errs = append(errs, field.Forbidden(child("prometheusCAFile"), fmt.Sprintf(
			"prometheusCAFile needs an https:// prometheusURL (got %q)", args.PrometheusURL)))
	}
	// The receiver takes samples only from a sender that presents the token: without one, anyone who reaches the
	// port could write the fleet's load.
	if valid("metricsSource") && args.MetricsSource == SourcePush && args.RemoteWriteTokenFile == "" {
		errs = append(errs, field.Forbidden(child("remoteWriteTokenFile"),
			"metricsSource push needs remoteWriteTokenFile (the bearer token remote-write senders must present)"))
	}
	if (args.RemoteWriteCertFile == "") != (args.RemoteWriteKeyFile == "") {
		missing := "remoteWriteKeyFile"
		if args.RemoteWriteCertFile == "" {
			missing = "remoteWriteCertFile"
		}
		errs = append(errs, field.Forbidden(child(missing),
			"remoteWriteCertFile and remoteWriteKeyFile go together (both for https, neither for http)"))
	}
	return errs
}

// addressProblem is why address is no host:port a server can listen on ("" when it is one).
func addressProblem(address string) string {
	host, port, err := net.SplitHostPort(address)
	if err != nil {
		return fmt.Sprintf("must be host:port or :port (got %q)", address)
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
		return fmt.Sprintf("port must be a number in [1, 65535] (got %q)", port)
	}
	if strings.ContainsAny(host, "/ ") {
		return fmt.Sprintf("host %q is no host name or address", host)
	}
	return ""
}

// Problems are errs in the words of the extender's check (plugin_args.py), which the conformance vectors and the
// kube_scheduler role's messages use: "<field>: <detail>" for a field ("sharedResources: <name>: ..." for an
// entry), the detail alone for a rule between fields (it names its fields).
func Problems(errs field.ErrorList) []string {
	problems := make([]string, 0, len(errs))
	for _, err := range errs {
		if err.Type == field.ErrorTypeForbidden {
			problems = append(problems, err.Detail)
			continue
		}
		name, key, entry := strings.Cut(strings.TrimSuffix(err.Field, "]"), "[")
		if entry {
			name += ": " + key
		}
		problems = append(problems, name+": "+err.Detail)
	}
	return problems
}
