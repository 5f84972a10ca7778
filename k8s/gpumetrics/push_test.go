package gpumetrics

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpufleet/mig/k8s/gpumetrics/remotewrite"
	"github.com/gpufleet/mig/k8s/gpuscore"

	"k8s.io/apimachinery/pkg/runtime"
)

func pushArgs(address, tokenFile, extra string) runtime.Object {
	raw := fmt.Sprintf(`{"metricsSource":"push","remoteWriteAddress":%q,"remoteWriteTokenFile":%q,
		"metricsRefreshSeconds":0.05%s}`, address, tokenFile, extra)
	return &runtime.Unknown{Raw: []byte(raw), ContentType: runtime.ContentTypeJSON}
}

// With metricsSource push, GPUScore and GPUClaimScore share one receiver and one Refresher, and a pushed sample
// reaches the Refresher's view without any Prometheus query (prometheusURL points nowhere).
func TestPushedSamplesReachTheSharedRefresher(t *testing.T) {
	shortFirstSampleWait(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	address := free.Addr().String()
	free.Close()
	token := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(token, []byte("push-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, first, err := StartMetrics(ctx, pushArgs(address, token, ""), "GPUScore")
	if err != nil {
		t.Fatal(err)
	}
	_, second, err := StartMetrics(ctx, pushArgs(address, token, ""), "GPUClaimScore")
	if err != nil || second != first {
		t.Fatalf("the second plugin: %v, the same Refresher: %v", err, second == first)
	}
	defaults := gpuscore.DefaultArgs()
	defaults.MetricsSource = gpuscore.SourcePush
	if every := refreshEvery(defaults); every != pushRefreshEvery || first.every != 50*time.Millisecond {
		t.Errorf("push refreshes every %v with the default metricsRefreshSeconds, every %v with 0.05", every, first.every)
	}
	now := time.Now().UnixMilli()
	var series []remotewrite.TimeSeries
	for _, metric := range []string{"DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE"} {
		series = append(series, remotewrite.TimeSeries{
			Labels: []remotewrite.Label{{Name: "__name__", Value: metric}, {Name: "Hostname", Value: "node-a"},
				{Name: "gpu", Value: "0"}, {Name: "GPU_I_ID", Value: "1"}, {Name: "GPU_I_PROFILE", Value: "1g.10gb"}},
			Samples: []remotewrite.Sample{{Value: 0.5, Timestamp: now}},
		})
	}
	request, _ := http.NewRequest(http.MethodPost, "http://"+address+remotewrite.Path,
		bytes.NewReader(remotewrite.Compress(nil, remotewrite.AppendWriteRequest(nil, series))))
	request.Header.Set("Authorization", "Bearer push-token")
	request.Header.Set("Content-Type", "application/x-protobuf")
	request.Header.Set("Content-Encoding", "snappy")
	response, err := http.DefaultClient.Do(request)
	if err != nil {
		t.Fatal(err)
	}
	response.Body.Close()
	if response.StatusCode != http.StatusNoContent {
		t.Fatalf("status %d", response.StatusCode)
	}
	deadline := time.Now().Add(5 * time.Second)
	for first.View().Snapshot.Nodes["node-a"] == nil {
		if time.Now().After(deadline) {
			t.Fatal("the pushed node is not in the Refresher's view after 5 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if devices := first.View().Snapshot.Nodes["node-a"].Devices["nvidia.com/mig-1g.10gb"]; len(devices) != 1 || devices[0].Util != 0.5 {
		t.Errorf("devices %+v", devices)
	}
	// A plugin that would receive at the same address with another token cannot start.
	_, _, err = StartMetrics(ctx, pushArgs(address, token+"-other", ""), "GPUClaimScore")
	if err == nil || !strings.Contains(err.Error(), "remoteWriteAddress "+address+": another plugin") {
		t.Errorf("another token at the same address: %v", err)
	}
}

// Push without a token file does not start, and opens no port; an unreadable TLS pair is an args problem.
func TestPushArgsProblemsStopTheScheduler(t *testing.T) {
	raw := `{"metricsSource":"push","remoteWriteAddress":"127.0.0.1:1"}`
	_, _, err := StartMetrics(context.Background(), &runtime.Unknown{Raw: []byte(raw), ContentType: runtime.ContentTypeJSON}, "GPUScore")
	if err == nil || !strings.Contains(err.Error(), "metricsSource push needs remoteWriteTokenFile") {
		t.Errorf("push without a token file: %v", err)
	}
	missing := filepath.Join(t.TempDir(), "missing")
	_, _, err = StartMetrics(context.Background(), pushArgs("127.0.0.1:1", missing, fmt.Sprintf(`,"remoteWriteCertFile":%q,"remoteWriteKeyFile":%q`, missing+".crt", missing+".key")), "GPUScore")
	if err == nil || !strings.Contains(err.Error(), "remoteWriteCertFile/remoteWriteKeyFile") {
		t.Errorf("an unreadable TLS pair: %v", err)
	}
}

// shortFirstSampleWait lets a test start receivers nothing sends to without waiting for a first sample.
func shortFirstSampleWait(t *testing.T) {
	wait, settle := pushFirstSampleWait, pushSettle
	pushFirstSampleWait, pushSettle = 50*time.Millisecond, 0
	t.Cleanup(func() { pushFirstSampleWait, pushSettle = wait, settle })
}

type sampler chan struct{}

func (s sampler) FirstSample() <-chan struct{} { return s }
func (s sampler) Nodes() int                   { return 1 }

// arriving is a source whose nodes come in one by one, every `every`, up to `total`.
type arriving struct {
	first chan struct{}
	began time.Time
	every time.Duration
	total int
}

func (a *arriving) FirstSample() <-chan struct{} { return a.first }
func (a *arriving) Nodes() int                   { return min(a.total, 1+int(time.Since(a.began)/a.every)) }

// A scheduler started with push waits for the first pushed sample, and the rest of that scrape, before its first
// pod; without any, it goes on after the wait (and says so), and a stopped scheduler does not wait.
func TestTheFirstPodWaitsForTheFirstPushedSamples(t *testing.T) {
	arrives := make(sampler)
	go func() { time.Sleep(100 * time.Millisecond); close(arrives) }()
	began := time.Now()
	if !awaitFirstSamples(context.Background(), arrives, 10*time.Second, 200*time.Millisecond) {
		t.Fatal("samples arrived, yet awaitFirstSamples says none did")
	}
	if took := time.Since(began); took < 300*time.Millisecond || took > 5*time.Second {
		t.Errorf("returned after %v: the first sample (100 ms) and the settle (200 ms), not more", took)
	}
	began = time.Now()
	if awaitFirstSamples(context.Background(), make(sampler), 150*time.Millisecond, time.Second) {
		t.Fatal("no sample arrived, yet awaitFirstSamples says one did")
	}
	if took := time.Since(began); took < 150*time.Millisecond || took > 900*time.Millisecond {
		t.Errorf("without samples it returned after %v, not after the 150 ms wait", took)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if awaitFirstSamples(ctx, make(sampler), 10*time.Second, time.Second) {
		t.Fatal("a stopped scheduler waited for samples")
	}
	// Nodes still coming (Prometheus catching up): the wait lasts until they stop, not a fixed settle after the first.
	first := make(chan struct{})
	close(first)
	slow := &arriving{first: first, began: time.Now(), every: 150 * time.Millisecond, total: 6}
	began = time.Now()
	awaitFirstSamples(context.Background(), slow, 10*time.Second, 400*time.Millisecond)
	if nodes, took := slow.Nodes(), time.Since(began); nodes != 6 || took < 5*150*time.Millisecond {
		t.Errorf("returned after %v with %d of 6 nodes: before the last one came", took, nodes)
	}
}
