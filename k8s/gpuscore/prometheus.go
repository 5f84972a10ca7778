package gpuscore

// Metrics off the scheduling path: Refresher polls Prometheus every metricsRefreshSeconds in its own goroutine
// and swaps in an immutable view; Filter and Score only load the current pointer. The queries are the
// extender's (metrics_source.PrometheusSource): the dcgm series, and the newest sample time per node, since an
// instant query's own timestamp is the evaluation time, not the scrape's. Over https with prometheusCAFile,
// Prometheus' certificate must chain to that CA alone; prometheusTokenFile's bearer token is re-read at each refresh,
// so a rotated token is used from the next refresh on.

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"
)

// PrometheusSource reads dcgm-exporter series through Prometheus' HTTP API.
type PrometheusSource struct {
	baseURL     string
	client      *http.Client
	timeout     time.Duration
	maxSkew     float64
	nodeLabels  []string
	seriesQuery string
	timesQuery  string
	tokenFile   string // "": no Authorization header
	recorded    bool   // the queries read the recorded form (UseRecorded)
	// evaluated is the rule group's evaluation the last snapshot was read after (RecordedEvaluationQuery's
	// answer); only the Refresher's goroutine calls Fetch.
	evaluated string
}

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

// NewPrometheusSource: timeout bounds each refresh as a whole (both queries); maxSkew is how far ahead of this
// clock a node's samples may be dated before the node counts as without metrics; matchers (ExporterMatchers)
// keep out series of the same names from other scrape jobs.
func NewPrometheusSource(baseURL string, nodeLabels []string, timeout time.Duration, maxSkew float64, matchers string) *PrometheusSource {
	series, times := PrometheusQueries(nodeLabels, matchers)
	return &PrometheusSource{
		baseURL:     strings.TrimRight(baseURL, "/"),
		client:      &http.Client{},
		timeout:     timeout,
		maxSkew:     maxSkew,
		nodeLabels:  nodeLabels,
		seriesQuery: series,
		timesQuery:  times,
	}
}

// PinCA makes Prometheus' certificate chain to the PEM CA(s) in caFile and to nothing else (not the system's CAs):
// whoever captures Prometheus' address (a Service with externalIPs) cannot answer with fake load. The error, for
// an unreadable file or one without a PEM certificate, is meant for the person who set prometheusCAFile.
func (p *PrometheusSource) PinCA(caFile string) error {
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return fmt.Errorf("prometheusCAFile: cannot read %s: %v", caFile, withoutPath(err))
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return fmt.Errorf("prometheusCAFile: no PEM certificate in %s", caFile)
	}
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	p.client = &http.Client{Transport: transport}
	return nil
}

// UseTokenFile sends the token in tokenFile as `Authorization: Bearer` with every query, read again at each
// refresh ("": none).
func (p *PrometheusSource) UseTokenFile(tokenFile string) { p.tokenFile = tokenFile }

// authorization is this refresh's Authorization header value ("" without a token file). Its errors name the
// file, never the token.
func (p *PrometheusSource) authorization() (string, error) {
	if p.tokenFile == "" {
		return "", nil
	}
	raw, err := os.ReadFile(p.tokenFile)
	if err != nil {
		return "", fmt.Errorf("cannot read prometheusTokenFile %s: %v", p.tokenFile, withoutPath(err))
	}
	token := strings.TrimSpace(string(raw))
	if token == "" {
		return "", fmt.Errorf("prometheusTokenFile %s is empty", p.tokenFile)
	}
	if strings.ContainsAny(token, "\r\n") {
		return "", fmt.Errorf("prometheusTokenFile %s holds more than one line (one token expected)", p.tokenFile)
	}
	return "Bearer " + token, nil
}

// withoutPath is a file error without the "open <path>:" its message would repeat (the messages name the file).
func withoutPath(err error) error {
	var pathErr *fs.PathError
	if errors.As(err, &pathErr) {
		return pathErr.Err
	}
	return err
}

// DecisionLabels are the labels a decision reads besides the node's (BuildSnapshot), as the extender's
// metrics_source.DECISION_LABELS.
var DecisionLabels = []string{"gpu", "UUID", "GPU_I_ID", "GPU_I_PROFILE", "pod", "namespace", "exported_pod", "exported_namespace"}

// PrometheusQueries is metrics_source.prometheus_queries: the series aggregated by the labels decisions read
// (Prometheus drops the rest before encoding its answer; series two exporters disagree on fold into their
// maximum), and the newest sample time per node, read from one metric every device reports (sampleTimeMetric):
// Prometheus' cost is per series read.
func PrometheusQueries(nodeLabels []string, matchers string) (series, times string) {
	selector, pinned := "", ""
	if matchers != "" {
		selector, pinned = "{"+matchers+"}", ","+matchers
	}
	keep := strings.Join(append(append([]string{"__name__"}, nodeLabels...), DecisionLabels...), ", ")
	series = fmt.Sprintf(`max by (%s) ({__name__=~"%s"%s})`, keep, strings.Join(DCGMMetrics, "|"), pinned)
	times = fmt.Sprintf("max by (%s) (timestamp(%s%s))", strings.Join(nodeLabels, ", "), sampleTimeMetric, selector)
	return series, times
}

// promSample is one element of an instant vector: {"metric": {...}, "value": [<time>, "<value>"]}.
type promSample struct {
	Metric map[string]string `json:"metric"`
	Value  []json.RawMessage `json:"value"`
}

func (s promSample) value() (float64, bool) {
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

func (p *PrometheusSource) query(ctx context.Context, promql, authorization string) ([]promSample, error) {
	request, err := http.NewRequestWithContext(ctx, http.MethodGet, p.baseURL+"/api/v1/query?query="+url.QueryEscape(promql), nil)
	if err != nil {
		return nil, err
	}
	if authorization != "" {
		request.Header.Set("Authorization", authorization)
	}
	response, err := p.client.Do(request)
	if err != nil {
		return nil, fmt.Errorf("Prometheus unreachable: %w", err)
	}
	defer response.Body.Close()
	body, err := io.ReadAll(response.Body)
	if err != nil {
		return nil, fmt.Errorf("Prometheus answer unreadable: %w", err)
	}
	var payload struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			ResultType string       `json:"resultType"`
			Result     []promSample `json:"result"`
		} `json:"data"`
	}
	if json.Unmarshal(body, &payload) != nil {
		return nil, fmt.Errorf("Prometheus answered HTTP %d without JSON", response.StatusCode)
	}
	if response.StatusCode != http.StatusOK || payload.Status != "success" {
		return nil, fmt.Errorf("Prometheus query failed (HTTP %d): %s", response.StatusCode, payload.Error)
	}
	if payload.Data.ResultType != "vector" {
		return nil, fmt.Errorf("Prometheus returned %q, expected a vector", payload.Data.ResultType)
	}
	return payload.Data.Result, nil
}

// Fetch queries both vectors and builds the snapshot numbered version; with the recorded form, nil (and no
// error) when the rule group was not evaluated since the last snapshot: nothing in the answer would differ.
func (p *PrometheusSource) Fetch(ctx context.Context, version uint64) (*Snapshot, error) {
	queriedAt := nowSeconds()
	authorization, err := p.authorization() // once per refresh: every query carries the same token
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	timedOut := fmt.Errorf("Prometheus did not answer both queries within prometheusTimeoutSeconds (%gs)", p.timeout.Seconds())
	evaluated := ""
	if p.recorded {
		// As the extender words it: three queries here, the probe first.
		timedOut = fmt.Errorf("Prometheus did not answer within prometheusTimeoutSeconds (%gs)", p.timeout.Seconds())
		probe, err := p.query(ctx, RecordedEvaluationQuery, authorization)
		if ctx.Err() != nil {
			return nil, timedOut
		}
		if err != nil {
			return nil, err
		}
		if evaluated = evaluationOf(probe); evaluated != "" && evaluated == p.evaluated {
			return nil, nil
		}
	}
	var series, times []promSample
	var seriesErr, timesErr error
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); series, seriesErr = p.query(ctx, p.seriesQuery, authorization) }()
	go func() { defer wg.Done(); times, timesErr = p.query(ctx, p.timesQuery, authorization) }()
	wg.Wait()
	if ctx.Err() != nil {
		return nil, timedOut
	}
	if seriesErr != nil {
		return nil, seriesErr
	}
	if timesErr != nil {
		return nil, timesErr
	}
	if p.recorded {
		p.evaluated = evaluated
		return buildFromRecorded(series, times, p.nodeLabels, queriedAt, nowSeconds(), p.maxSkew, version), nil
	}
	return buildFromProm(series, times, p.nodeLabels, queriedAt, nowSeconds(), p.maxSkew, version), nil
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

// buildFromProm is metrics_source.PrometheusSource._build: unparsable values are skipped, nodes with values out
// of range or dated beyond now + maxSkew are left out.
func buildFromProm(series, times []promSample, nodeLabels []string, queriedAt, now, maxSkew float64, version uint64) *Snapshot {
	samples := make([]Sample, 0, len(series))
	for _, item := range series {
		if v, ok := item.value(); ok {
			samples = append(samples, Sample{Name: item.Metric["__name__"], Labels: item.Metric, Value: v})
		}
	}
	return buildFromSamples(samples, times, nodeLabels, queriedAt, now, maxSkew, version)
}

// buildFromSamples is the rest of metrics_source.PrometheusSource._build, whichever form the series came in:
// the sample times per node, screening, the snapshot, nodes dated beyond now + maxSkew left out.
func buildFromSamples(samples []Sample, times []promSample, nodeLabels []string, queriedAt, now, maxSkew float64, version uint64) *Snapshot {
	nodeTimes := map[string]float64{}
	for _, item := range times {
		node := nodeNameOf(item.Metric, nodeLabels)
		stamp, ok := item.value()
		if node == "" || !ok || math.IsNaN(stamp) || math.IsInf(stamp, 0) {
			continue
		}
		if t, seen := nodeTimes[node]; !seen || stamp > t {
			nodeTimes[node] = stamp
		}
	}
	snapshot := BuildSnapshot(screenSamples(samples, nodeLabels), nodeLabels, queriedAt, nodeTimes, version)
	dropFutureNodes(snapshot, now, maxSkew)
	return snapshot
}

func nowSeconds() float64 { return float64(time.Now().UnixNano()) / 1e9 }

// Source is where snapshots come from (Prometheus in production, a fake in tests). Fetch answers nil and no
// error when nothing changed since the last snapshot it returned.
type Source interface {
	Fetch(ctx context.Context, version uint64) (*Snapshot, error)
}

// View is what one refresh publishes: the snapshot and, with scoringStrategy auto, the modes it moved to.
type View struct {
	Snapshot *Snapshot
	Modes    map[string]Mode // nil unless auto
}

var emptyView = &View{Snapshot: &Snapshot{Nodes: map[string]*NodeMetrics{}}}

// Refresher owns the current View. Errors keep the previous snapshot, which then ages into staleness.
type Refresher struct {
	source   Source
	every    time.Duration
	policy   Policy
	selector *ModeSelector // auto only
	current  atomic.Pointer[View]

	lastError string
	blind     blindness
}

func NewRefresher(source Source, every time.Duration, policy Policy) *Refresher {
	r := &Refresher{source: source, every: every, policy: policy}
	if policy.Strategy == StrategyAuto {
		r.selector = &ModeSelector{PackBelow: policy.AutoPackBelow, Hysteresis: policy.AutoHysteresis}
	}
	r.current.Store(emptyView)
	return r
}

// View is the current view; never nil.
func (r *Refresher) View() *View { return r.current.Load() }

// RefreshOnce polls the source once, then records whether decisions are blind (blindness.go); errors are
// logged at WARNING when they change, never returned to the scheduler.
func (r *Refresher) RefreshOnce(ctx context.Context) bool {
	answered := r.refresh(ctx)
	snapshot, now := r.View().Snapshot, nowSeconds()
	r.blind.observe(BlindReason(snapshot, &r.policy, now, r.lastError), r.policy.missingPolicyName(), now)
	stale, description := StaleNodes(snapshot, &r.policy, now)
	r.blind.observeStale(stale, description, len(snapshot.Nodes), r.policy.missingPolicyName(), now)
	return answered
}

// BlindReason is why decisions use no metrics as of the last refresh ("" while they use some).
func (r *Refresher) BlindReason() string { return r.blind.current() }

func (r *Refresher) refresh(ctx context.Context) bool {
	logger := klog.FromContext(ctx)
	snapshot, err := r.source.Fetch(ctx, r.View().Snapshot.Version+1)
	if err != nil {
		refreshFailures.Inc()
		if err.Error() != r.lastError {
			klog.Warningf("GPUScore: metrics source failed; decisions use the previous snapshot until it ages out: %v", err)
		}
		r.lastError = err.Error()
		return false
	}
	if r.lastError != "" {
		logger.Info("GPUScore: metrics source answers again")
	}
	r.lastError = ""
	if snapshot == nil {
		return true // unchanged: the current view (and the verdicts memoized on it) stays
	}
	snapshot.Rank(&r.policy)
	view := &View{Snapshot: snapshot}
	if r.selector != nil {
		// auto moves once per new snapshot, never per pod (scoring.ModeSelector, as the extender's service).
		changed := r.selector.Update(FleetMeanLoad(snapshot, &r.policy, nowSeconds()))
		if len(changed) > 0 {
			logger.Info("GPUScore: scoring mode changed", "modes", changed)
		}
		view.Modes = make(map[string]Mode, len(r.selector.Modes))
		for resource, mode := range r.selector.Modes {
			view.Modes[resource] = mode
		}
	}
	r.current.Store(view)
	return true
}

// Run polls until ctx ends.
func (r *Refresher) Run(ctx context.Context) {
	ticker := time.NewTicker(r.every)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
			r.RefreshOnce(ctx)
		}
	}
}
