// Package rwbench makes a fleet's remote-write traffic and measures what receiving it costs: the requests
// Prometheus would send for N nodes x G GPUs x K MIG instances of dcgm-exporter series (the exporter's full label set
// as a Prometheus Operator scrape labels it, pods on every other instance), in batches like Prometheus' queue
// (max_samples_per_send), and the receiver's CPU time for them, measured with getrusage (the process' CPU, the
// garbage collector's included), against the pull form's decoding of the same fleet's Prometheus answer.
// gpufleet-rw-sender sends the same requests over the network; BenchmarkReceiver and TestPrintReceiverFigures run
// Measure.
package rwbench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"
	"time"

	"github.com/gpufleet/mig/k8s/gpumetrics/remotewrite"
	"github.com/gpufleet/mig/k8s/gpuscore"
)

// Fleet is the shape of the traffic.
type Fleet struct {
	Nodes, GPUs, Instances int
	Profile                string // the instances' MIG profile
	Job, Namespace         string // the scrape's job and namespace labels
}

// DefaultFleet is n nodes x 8 GPUs x 7 instances of 1g.10gb, scraped as the dcgm_exporter role's job does.
func DefaultFleet(nodes int) Fleet {
	return Fleet{Nodes: nodes, GPUs: 8, Instances: 7, Profile: "1g.10gb", Job: "dcgm-exporter", Namespace: "gpufleet-node-agents"}
}

// metrics are the series each instance sends after write_relabel_configs kept the ones a decision reads.
var metrics = []string{"DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE"}

// SeriesPerInterval is how many series (one sample each) the fleet sends per scrape interval.
func (f Fleet) SeriesPerInterval() int { return f.Nodes * f.GPUs * f.Instances * len(metrics) }

// NodeName is node i's name.
func NodeName(i int) string { return fmt.Sprintf("node-%05d", i) }

// nodeSeries appends node i's series, sampled at ms, to series (reusing its storage).
func (f Fleet) nodeSeries(series []remotewrite.TimeSeries, i int, ms int64, interval int) []remotewrite.TimeSeries {
	node := NodeName(i)
	host := "Hostname"
	if i%2 == 1 {
		host = "hostname" // newer exporter images
	}
	for gpu := range f.GPUs {
		for instance := range f.Instances {
			util := float64((i*31+gpu*7+instance*3+interval)%100) / 100
			total := 10240.0
			for m, metric := range metrics {
				labels := []remotewrite.Label{
					{Name: "__name__", Value: metric},
					{Name: "DCGM_FI_DRIVER_VERSION", Value: "550.54.15"},
					{Name: "GPU_I_ID", Value: strconv.Itoa(instance + 1)},
					{Name: "GPU_I_PROFILE", Value: f.Profile},
					{Name: host, Value: node},
					{Name: "UUID", Value: fmt.Sprintf("GPU-%08x-0000-4000-8000-%012x", i, gpu)},
					{Name: "container", Value: "nvidia-dcgm-exporter"},
					{Name: "device", Value: "nvidia" + strconv.Itoa(gpu)},
					{Name: "endpoint", Value: "gpu-metrics"},
					{Name: "gpu", Value: strconv.Itoa(gpu)},
					{Name: "instance", Value: fmt.Sprintf("10.%d.%d.%d:9400", i>>16&255, i>>8&255, i&255)},
					{Name: "job", Value: f.Job},
					{Name: "modelName", Value: "NVIDIA H100 80GB HBM3"},
					{Name: "namespace", Value: f.Namespace},
					{Name: "pci_bus_id", Value: fmt.Sprintf("00000000:%02X:00.0", 0x18+gpu*0x10)},
					{Name: "pod", Value: "dcgm-exporter-" + node},
					{Name: "service", Value: "dcgm-exporter"},
				}
				if instance%2 == 0 { // a tenant's pod on the instance: the exporter's pod mapping
					labels = append(labels,
						remotewrite.Label{Name: "exported_container", Value: "main"},
						remotewrite.Label{Name: "exported_namespace", Value: "tenant-a"},
						remotewrite.Label{Name: "exported_pod", Value: fmt.Sprintf("job-%d-%d-%d", i, gpu, instance)})
				}
				value := []float64{util, util * total, (1 - util) * total}[m]
				series = append(series, remotewrite.TimeSeries{Labels: labels, Samples: []remotewrite.Sample{{Value: value, Timestamp: ms}}})
			}
		}
	}
	return series
}

// Requests are the bodies (snappy-compressed WriteRequests) of one scrape interval of the fleet, sampled at ms,
// perSend series each at most, nodes in order (a node's series together, as one target's scrape).
func (f Fleet) Requests(ms int64, interval, perSend int) [][]byte {
	var bodies [][]byte
	var batch []remotewrite.TimeSeries
	var raw []byte
	flush := func() {
		raw = remotewrite.AppendWriteRequest(raw[:0], batch)
		bodies = append(bodies, remotewrite.Compress(nil, raw))
		batch = batch[:0]
	}
	for i := range f.Nodes {
		batch = f.nodeSeries(batch, i, ms, interval)
		if len(batch) >= perSend {
			// Cut at perSend exactly: the rest starts the next request.
			rest := append([]remotewrite.TimeSeries(nil), batch[perSend:]...)
			batch = batch[:perSend]
			flush()
			batch = append(batch, rest...)
		}
	}
	if len(batch) > 0 {
		flush()
	}
	return bodies
}

// Figures are one measurement: CPU seconds of the process per scrape interval.
type Figures struct {
	Fleet           Fleet
	Series          int     // series (samples) per interval
	Requests        int     // requests per interval
	BodyBytes       int     // compressed bytes per interval
	ReceiveCPU      float64 // the handler: snappy, decoding, the Store
	FetchCPU        float64 // the Refresher's reads: fetchesPerInterval Fetch + Rank
	Fetches         int
	FetchWallMax    time.Duration // the longest Fetch + Rank: what a sample waits beyond the Refresher's tick
	PullCPU         float64       // the pull form: one refresh's JSON decode and fold of the same fleet's answer
	PullAnswerBytes int
	IntervalSeconds float64
	Intervals       int     // intervals measured (the figures above are per interval, averaged)
	GCs             int     // garbage collections during them, all told
	AllocBytes      float64 // bytes allocated per interval
}

// PerSampleNs is the receiver's CPU per sample, Fetch included.
func (f Figures) PerSampleNs() float64 {
	return (f.ReceiveCPU + f.FetchCPU) / float64(f.Series) * 1e9
}

// CorePercent is the receiver's share of one core at the interval, Fetch included.
func (f Figures) CorePercent() float64 {
	return (f.ReceiveCPU + f.FetchCPU) / f.IntervalSeconds * 100
}

func (f Figures) String() string {
	return fmt.Sprintf("%d nodes x %d GPUs x %d instances: %d samples/interval in %d requests (%.1f MB snappy)\n"+
		"  push: receive %.3f s CPU + %d Fetch+Rank %.3f s CPU per %gs interval = %.2f %% of one core, %.0f ns/sample\n"+
		"  averaged over %d intervals (%d garbage collections in them, %.0f MB allocated per interval)\n"+
		"  a sample arrived is in the published snapshot after the Refresher's next tick (1 s at most) + at most %v of Fetch+Rank\n"+
		"  pull: one refresh's decode+fold of the %.1f MB JSON answer %.3f s CPU (%.2f %% of one core per refresh every %gs)",
		f.Fleet.Nodes, f.Fleet.GPUs, f.Fleet.Instances, f.Series, f.Requests, float64(f.BodyBytes)/1e6,
		f.ReceiveCPU, f.Fetches, f.FetchCPU, f.IntervalSeconds, f.CorePercent(), f.PerSampleNs(),
		f.Intervals, f.GCs, f.AllocBytes/1e6, f.FetchWallMax.Round(time.Millisecond),
		float64(f.PullAnswerBytes)/1e6, f.PullCPU, f.PullCPU/f.IntervalSeconds*100, f.IntervalSeconds)
}

// cpuSeconds is the process' user + system CPU time so far.
func cpuSeconds() float64 {
	var usage syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &usage); err != nil {
		return 0
	}
	return float64(usage.Utime.Nano()+usage.Stime.Nano()) / 1e9
}

// Measure sends a warm interval of the fleet to a receiver through its handler (no network: the sender's and the
// HTTP server's costs are not the receiver's), then intervals more, measured, each split into fetches slices with a
// Fetch and a Rank after each (the Refresher reading every second of a 15 s interval), and measures the pull form's
// refresh. The measured intervals send the same requests (the Store takes a sample as new as the one it holds): the
// garbage collector's share is what their allocations cost, so more intervals give it more fairly.
func Measure(fleet Fleet, perSend, fetches, intervals int, interval time.Duration) (Figures, error) {
	figures := Figures{Fleet: fleet, Series: fleet.SeriesPerInterval(), Fetches: fetches, IntervalSeconds: interval.Seconds(), Intervals: intervals}
	dir, err := os.MkdirTemp("", "rwbench")
	if err != nil {
		return figures, err
	}
	defer os.RemoveAll(dir)
	token := filepath.Join(dir, "token")
	if err := os.WriteFile(token, []byte("bench-token"), 0o600); err != nil {
		return figures, err
	}
	store := remotewrite.NewStore([]string{"Hostname", "hostname"}, fleet.Job, fleet.Namespace, 5)
	receiver := remotewrite.NewReceiver(store, token)
	source := store.NewSource()
	policy := gpuscore.DefaultArgs()
	rank := policy.Policy()
	start := time.Now().Add(-2 * interval).UnixMilli()
	const warm = 1
	var measured [][]byte
	send := func(bodies [][]byte) error {
		for _, body := range bodies {
			request := httptest.NewRequest(http.MethodPost, remotewrite.Path, bytes.NewReader(body))
			request.Header.Set("Authorization", "Bearer bench-token")
			request.Header.Set("Content-Type", "application/x-protobuf")
			request.Header.Set("Content-Encoding", "snappy")
			recorder := httptest.NewRecorder()
			receiver.ServeHTTP(recorder, request)
			if recorder.Code != http.StatusNoContent {
				return fmt.Errorf("status %d: %s", recorder.Code, recorder.Body.String())
			}
		}
		return nil
	}
	version := uint64(0)
	var last *gpuscore.Snapshot
	fetch := func() error {
		version++
		snapshot, err := source.Fetch(context.Background(), version)
		if err != nil {
			return err
		}
		if snapshot != nil {
			snapshot.Rank(&rank)
			last = snapshot
		}
		return nil
	}
	for i := range warm {
		if err := send(fleet.Requests(start+int64(i)*interval.Milliseconds(), i, perSend)); err != nil {
			return figures, err
		}
		if err := fetch(); err != nil {
			return figures, err
		}
	}
	measured = fleet.Requests(start+int64(warm)*interval.Milliseconds(), warm, perSend)
	figures.Requests = len(measured)
	for _, body := range measured {
		figures.BodyBytes += len(body)
	}
	runtime.GC()
	var memBefore, memAfter runtime.MemStats
	runtime.ReadMemStats(&memBefore)
	for range intervals {
		for slice := range fetches {
			part := measured[len(measured)*slice/fetches : len(measured)*(slice+1)/fetches]
			before := cpuSeconds()
			if err := send(part); err != nil {
				return figures, err
			}
			middle, began := cpuSeconds(), time.Now()
			if err := fetch(); err != nil {
				return figures, err
			}
			after := cpuSeconds()
			figures.FetchWallMax = max(figures.FetchWallMax, time.Since(began))
			figures.ReceiveCPU += middle - before
			figures.FetchCPU += after - middle
		}
	}
	runtime.ReadMemStats(&memAfter)
	figures.ReceiveCPU /= float64(intervals)
	figures.FetchCPU /= float64(intervals)
	figures.GCs = int(memAfter.NumGC - memBefore.NumGC)
	figures.AllocBytes = float64(memAfter.TotalAlloc-memBefore.TotalAlloc) / float64(intervals)
	if last == nil || len(last.Nodes) != fleet.Nodes {
		return figures, fmt.Errorf("the pushed snapshot lacks nodes of the %d sent", fleet.Nodes)
	}
	devices := 0
	for _, node := range last.Nodes {
		for _, list := range node.Devices {
			devices += len(list)
		}
	}
	if devices != fleet.Nodes*fleet.GPUs*fleet.Instances {
		return figures, fmt.Errorf("the pushed snapshot has %d devices, %d sent", devices, fleet.Nodes*fleet.GPUs*fleet.Instances)
	}

	answer, err := pullAnswer(fleet, start)
	if err != nil {
		return figures, err
	}
	figures.PullAnswerBytes = len(answer)
	runtime.GC()
	before := cpuSeconds()
	var payload struct {
		Data struct {
			Result []gpuscore.Series `json:"result"`
		} `json:"data"`
	}
	if err := json.Unmarshal(answer, &payload); err != nil {
		return figures, err
	}
	snapshot := gpuscore.SnapshotFromSeries(payload.Data.Result, nil, []string{"Hostname", "hostname"}, float64(start)/1000, float64(start)/1000, 5, 1)
	snapshot.Rank(&rank)
	figures.PullCPU = cpuSeconds() - before
	if len(snapshot.Nodes) != fleet.Nodes {
		return figures, fmt.Errorf("the pull form folded %d nodes of %d", len(snapshot.Nodes), fleet.Nodes)
	}
	return figures, nil
}

// pullAnswer is Prometheus' answer to the pull form's raw series query for the fleet: the series with the labels
// the query keeps (max by the decision's labels).
func pullAnswer(fleet Fleet, ms int64) ([]byte, error) {
	keep := map[string]bool{"__name__": true, "Hostname": true, "hostname": true}
	for _, label := range gpuscore.DecisionLabels() {
		keep[label] = true
	}
	type item struct {
		Metric map[string]string `json:"metric"`
		Value  [2]any            `json:"value"`
	}
	var result []item
	var series []remotewrite.TimeSeries
	for i := range fleet.Nodes {
		series = fleet.nodeSeries(series[:0], i, ms, 0)
		for _, s := range series {
			metric := map[string]string{}
			for _, l := range s.Labels {
				if keep[l.Name] {
					metric[l.Name] = l.Value
				}
			}
			result = append(result, item{metric, [2]any{float64(ms) / 1000, strconv.FormatFloat(s.Samples[0].Value, 'g', -1, 64)}})
		}
	}
	return json.Marshal(map[string]any{"status": "success", "data": map[string]any{"resultType": "vector", "result": result}})
}
