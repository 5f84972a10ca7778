package gpumetrics

// The Refreshers of the process: GPUScore and GPUClaimScore, each built by the scheduler framework from its own
// args, share one Refresher when their args are the same, so that Prometheus is polled once. This registry is the
// package's one piece of process-wide state, kept here beside the Refresher and out of the plugins.

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/gpufleet/mig/k8s/gpuscore"

	"k8s.io/apimachinery/pkg/runtime"
)

// One Refresher per distinct args in the process: GPUScore and GPUClaimScore in gpufleet-scheduler's profile read
// the same snapshot instead of polling Prometheus twice.
var (
	refreshersMu sync.Mutex
	refreshers   = map[string]*Refresher{}
)

// sharedRefresher is the running Refresher for args, started (one poll, then the background loop) on first use.
// source polls Prometheus for the first plugin built with args (prometheusSourceFor); a later one's is dropped.
func sharedRefresher(ctx context.Context, args gpuscore.Args, source Source) *Refresher {
	key, err := json.Marshal(args)
	if err != nil { // gpuscore.Args is plain data; cannot happen, but never share on a bad key
		key = nil
	}
	refreshersMu.Lock()
	defer refreshersMu.Unlock()
	if r, ok := refreshers[string(key)]; ok && key != nil {
		return r
	}
	r := NewRefresher(source, Seconds(args.MetricsRefreshSeconds), args.Policy())
	r.RefreshOnce(ctx) // one poll before the first pod, as the extender does before serving
	go r.Run(ctx)
	if key != nil {
		refreshers[string(key)] = r
	}
	return r
}

// prometheusSourceFor is the Prometheus source args describe: its CA pinned (read now: an unreadable file is an
// args problem), its bearer token file re-read at each refresh, and the form it reads (prometheusQuery).
func prometheusSourceFor(args gpuscore.Args) (*PrometheusSource, error) {
	source := newPrometheusSource(args.PrometheusURL, args.NodeNameLabels, Seconds(args.PrometheusTimeoutSeconds),
		args.MetricsMaxClockSkewSeconds, gpuscore.ExporterMatchers(args.ExporterJob, args.ExporterNamespace))
	if args.PrometheusCAFile != "" {
		if err := source.pinCA(args.PrometheusCAFile); err != nil {
			return nil, err
		}
	}
	source.useTokenFile(args.PrometheusTokenFile)
	if args.PrometheusQuery == gpuscore.QueryRecorded {
		source.useRecorded()
	}
	return source, nil
}

// StartMetrics parses a plugin's args (GPUScore's, for both plugins: GPUScore and GPUClaimScore) and returns them
// with the Refresher they share. The CA file is read here, at start, and its problem listed with the others: a
// scheduler that would query Prometheus unpinned, or not at all, does not start.
func StartMetrics(ctx context.Context, obj runtime.Object, plugin string) (gpuscore.Args, *Refresher, error) {
	args, problems := gpuscore.ParseArgs(obj)
	source, err := prometheusSourceFor(args)
	if err != nil {
		problems = append(problems, err.Error())
	}
	if len(problems) > 0 {
		return args, nil, fmt.Errorf("invalid %s args: %s", plugin, strings.Join(problems, "; "))
	}
	registerMetricsOnce()
	return args, sharedRefresher(ctx, args, source), nil // polled once already, then in the background
}

// Seconds is a duration of s seconds (the args give durations as numbers).
func Seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
