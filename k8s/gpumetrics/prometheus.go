// Package gpumetrics reads GPU load for GPUScore and GPUClaimScore: the Prometheus client, the Refresher that
// publishes snapshots off the scheduling path, the blindness signals, and the one registry of Refreshers that
// plugins with the same args share.
package gpumetrics

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
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gpufleet/mig/k8s/gpuscore"

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
}

// newPrometheusSource: timeout bounds each refresh as a whole (both queries); maxSkew is how far ahead of this
// clock a node's samples may be dated before the node counts as without metrics; matchers (gpuscore.ExporterMatchers)
// keep out series of the same names from other scrape jobs.
func newPrometheusSource(baseURL string, nodeLabels []string, timeout time.Duration, maxSkew float64, matchers string) *PrometheusSource {
	series, times := gpuscore.PrometheusQueries(nodeLabels, matchers)
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

// pinCA makes Prometheus' certificate chain to the PEM CA(s) in caFile and to nothing else (not the system's CAs):
// whoever captures Prometheus' address (a Service with externalIPs) cannot answer with fake load. The error, for
// an unreadable file or one without a PEM certificate, is meant for the person who set prometheusCAFile.
func (p *PrometheusSource) pinCA(caFile string) error {
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

// useTokenFile sends the token in tokenFile as `Authorization: Bearer` with every query, read again at each
// refresh ("": none).
func (p *PrometheusSource) useTokenFile(tokenFile string) { p.tokenFile = tokenFile }

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

func (p *PrometheusSource) query(ctx context.Context, promql, authorization string) ([]gpuscore.Series, error) {
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
			ResultType string            `json:"resultType"`
			Result     []gpuscore.Series `json:"result"`
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

// Fetch queries both vectors and builds the snapshot numbered version.
func (p *PrometheusSource) Fetch(ctx context.Context, version uint64) (*gpuscore.Snapshot, error) {
	queriedAt := Now()
	authorization, err := p.authorization() // once per refresh: every query carries the same token
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	timedOut := fmt.Errorf("Prometheus did not answer both queries within prometheusTimeoutSeconds (%gs)", p.timeout.Seconds())
	var series, times []gpuscore.Series
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
	return gpuscore.SnapshotFromSeries(series, times, p.nodeLabels, queriedAt, Now(), p.maxSkew, version), nil
}

// Now is the wall clock in unix seconds, the unit of the samples' times.
func Now() float64 { return float64(time.Now().UnixNano()) / 1e9 }

// Source is where snapshots come from (Prometheus in production, a fake in tests). Fetch answers nil and no
// error when nothing changed since the last snapshot it returned.
type Source interface {
	Fetch(ctx context.Context, version uint64) (*gpuscore.Snapshot, error)
}

// View is what one refresh publishes: the snapshot and, with scoringStrategy auto, the modes it moved to.
type View struct {
	Snapshot *gpuscore.Snapshot
	Modes    map[string]gpuscore.Mode // nil unless auto
}

var emptyView = &View{Snapshot: &gpuscore.Snapshot{Nodes: map[string]*gpuscore.NodeMetrics{}}}

// Refresher owns the current View. Errors keep the previous snapshot, which then ages into staleness.
type Refresher struct {
	source   Source
	every    time.Duration
	policy   gpuscore.Policy
	selector *gpuscore.ModeSelector // auto only
	current  atomic.Pointer[View]

	lastError string
	blind     blindness
}

func NewRefresher(source Source, every time.Duration, policy gpuscore.Policy) *Refresher {
	r := &Refresher{source: source, every: every, policy: policy}
	if policy.Strategy == gpuscore.StrategyAuto {
		r.selector = &gpuscore.ModeSelector{PackBelow: policy.AutoPackBelow, Hysteresis: policy.AutoHysteresis}
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
	snapshot, now := r.View().Snapshot, Now()
	r.blind.observe(BlindReason(snapshot, &r.policy, now, r.lastError), r.policy.MissingPolicyName(), now)
	stale, description := staleNodes(snapshot, &r.policy, now)
	r.blind.observeStale(stale, description, len(snapshot.Nodes), r.policy.MissingPolicyName(), now)
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
		changed := r.selector.Update(gpuscore.FleetMeanLoad(snapshot, &r.policy, Now()))
		if len(changed) > 0 {
			logger.Info("GPUScore: scoring mode changed", "modes", changed)
		}
		view.Modes = make(map[string]gpuscore.Mode, len(r.selector.Modes))
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
