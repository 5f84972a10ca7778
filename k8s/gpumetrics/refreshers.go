package gpumetrics

// The Refreshers of the process: GPUScore and GPUClaimScore, each built by the scheduler framework from its own
// args, share one Refresher when their args are the same, so that Prometheus is polled once; with metricsSource push
// they share one remote-write receiver. These two registries are the package's process-wide state, kept here beside
// the Refresher and out of the plugins.

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/gpufleet/mig/k8s/gpumetrics/remotewrite"
	"github.com/gpufleet/mig/k8s/gpuscore"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/klog/v2"
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
	r := NewRefresher(source, refreshEvery(args), args.Policy())
	if pushed, ok := source.(firstSampler); ok {
		// A receiver just started holds nothing: decisions would be blind until Prometheus' next send.
		awaitFirstSamples(ctx, pushed, pushFirstSampleWait, pushSettle)
	}
	r.RefreshOnce(ctx) // one poll before the first pod, as the extender does before serving
	go r.Run(ctx)
	if key != nil {
		refreshers[string(key)] = r
	}
	return r
}

// prometheusSourceFor is the Prometheus source args describe: its CA pinned (read now: an unreadable file is an
// args problem), its bearer token file re-read at each refresh.
func prometheusSourceFor(args gpuscore.Args) (*PrometheusSource, error) {
	source := newPrometheusSource(args.PrometheusURL, args.NodeNameLabels, Seconds(args.PrometheusTimeoutSeconds),
		args.MetricsMaxClockSkewSeconds, gpuscore.ExporterMatchers(args.ExporterJob, args.ExporterNamespace))
	if args.PrometheusCAFile != "" {
		if err := source.pinCA(args.PrometheusCAFile); err != nil {
			return nil, err
		}
	}
	source.useTokenFile(args.PrometheusTokenFile)
	return source, nil
}

// pushRefreshEvery is how often a Refresher reads the push form's Store at most: a Fetch there costs only the nodes
// that received samples since the last one (and nothing when none did), so a pushed sample reaches decisions within
// about a second of its arrival whatever metricsRefreshSeconds says.
const pushRefreshEvery = time.Second

// A scheduler started with metricsSource push waits before its first pod until its receiver has the fleet: up to
// pushFirstSampleWait for the first pushed sample (about one scrape interval and Prometheus' send deadline), then
// until no new node has come for pushSettle (the rest of that scrape, which Prometheus sends in several requests,
// and more slowly when it catches up on what it could not send before), within pushFirstSampleWait too. A node the
// receiver has not heard of yet would be decided on as a node without metrics.
// (Variables for the tests, which start receivers nothing sends to.)
var (
	pushFirstSampleWait = 30 * time.Second
	pushSettle          = 2 * time.Second
)

type firstSampler interface {
	FirstSample() <-chan struct{}
	Nodes() int
}

// awaitFirstSamples returns once source has kept a sample and no new node has come for settle since, after at most
// wait, or when ctx ends; it says which in the log.
func awaitFirstSamples(ctx context.Context, source firstSampler, wait, settle time.Duration) bool {
	klog.InfoS("GPUScore: waiting for the first pushed samples before scheduling", "atMost", wait)
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case <-source.FirstSample():
	case <-timer.C:
		klog.Warningf("GPUScore: no pushed sample in %s: scheduling without metrics (onMissingMetrics decides) until "+
			"Prometheus sends; check its remote_write entries for this receiver", wait)
		return false
	case <-ctx.Done():
		return false
	}
	tick := time.NewTicker(min(settle/4+time.Millisecond, 250*time.Millisecond))
	defer tick.Stop()
	nodes, steady := source.Nodes(), time.Now()
	for time.Since(steady) < settle {
		select {
		case <-tick.C:
			if now := source.Nodes(); now != nodes {
				nodes, steady = now, time.Now()
			}
		case <-timer.C:
			klog.Warningf("GPUScore: pushed samples still bring new nodes after %s (%d so far): scheduling now", wait, nodes)
			return true
		case <-ctx.Done():
			return false
		}
	}
	klog.InfoS("GPUScore: pushed samples received", "nodes", nodes)
	return true
}

// refreshEvery is how often the Refresher for args reads its source.
func refreshEvery(args gpuscore.Args) time.Duration {
	every := Seconds(args.MetricsRefreshSeconds)
	if args.MetricsSource == gpuscore.SourcePush {
		every = min(every, pushRefreshEvery)
	}
	return every
}

// The remote-write receivers of the process, by remoteWriteAddress: one HTTP server per address, whichever plugins
// read it (GPUScore and GPUClaimScore), each Refresher with its own Source of the one Store.
var (
	receiversMu sync.Mutex
	receivers   = map[string]*pushReceiver{}
)

type pushReceiver struct {
	store    *remotewrite.Store
	settings string // what the Store and the server were made with: another plugin must ask for the same
	address  net.Addr
	done     <-chan struct{}
}

// pushSourceFor is a Source of the receiver args describe, which is started (listening, its TLS pair read) by the
// first plugin that asks for it and stopped when that plugin's ctx ends.
func pushSourceFor(ctx context.Context, args gpuscore.Args) (Source, error) {
	settings, _ := json.Marshal([]any{args.RemoteWriteTokenFile, args.RemoteWriteCertFile, args.RemoteWriteKeyFile,
		args.NodeNameLabels, args.ExporterJob, args.ExporterNamespace, args.MetricsMaxClockSkewSeconds})
	receiversMu.Lock()
	defer receiversMu.Unlock()
	if running, ok := receivers[args.RemoteWriteAddress]; ok && running.done != nil && !isDone(running.done) {
		if running.settings != string(settings) {
			return nil, fmt.Errorf("remoteWriteAddress %s: another plugin of this scheduler receives there with other "+
				"remoteWriteTokenFile, remoteWriteCertFile, remoteWriteKeyFile, nodeNameLabels, exporterJob, exporterNamespace "+
				"or metricsMaxClockSkewSeconds: the plugins that read pushed metrics must agree on them", args.RemoteWriteAddress)
		}
		return running.store.NewSource(), nil
	}
	store := remotewrite.NewStore(args.NodeNameLabels, args.ExporterJob, args.ExporterNamespace, args.MetricsMaxClockSkewSeconds)
	address, err := remotewrite.NewReceiver(store, args.RemoteWriteTokenFile).Serve(ctx, args.RemoteWriteAddress,
		args.RemoteWriteCertFile, args.RemoteWriteKeyFile)
	if err != nil {
		return nil, err
	}
	receivers[args.RemoteWriteAddress] = &pushReceiver{store: store, settings: string(settings), address: address, done: ctx.Done()}
	return store.NewSource(), nil
}

func isDone(done <-chan struct{}) bool {
	select {
	case <-done:
		return true
	default:
		return false
	}
}

// StartMetrics parses a plugin's args (GPUScore's, for both plugins: GPUScore and GPUClaimScore) and returns them
// with the Refresher they share. The CA file is read here, at start, and its problem listed with the others: a
// scheduler that would query Prometheus unpinned, or not at all, does not start. With metricsSource push, the
// remote-write receiver starts here (once per address in the process) and its problems (the address taken, the TLS
// pair unreadable) are the args' too.
func StartMetrics(ctx context.Context, obj runtime.Object, plugin string) (gpuscore.Args, *Refresher, error) {
	args, problems := gpuscore.ParseArgs(obj)
	var source Source
	if args.MetricsSource == gpuscore.SourcePush {
		// The receiver listens only for args without problems: a scheduler that will not start opens no port.
		if len(problems) == 0 {
			pushed, err := pushSourceFor(ctx, args)
			if err != nil {
				problems = append(problems, err.Error())
			}
			source = pushed
		}
	} else {
		pulled, err := prometheusSourceFor(args)
		if err != nil {
			problems = append(problems, err.Error())
		}
		source = pulled
	}
	if len(problems) > 0 {
		return args, nil, fmt.Errorf("invalid %s args: %s", plugin, strings.Join(problems, "; "))
	}
	registerMetricsOnce()
	return args, sharedRefresher(ctx, args, source), nil // polled once already, then in the background
}

// Seconds is a duration of s seconds (the args give durations as numbers).
func Seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
