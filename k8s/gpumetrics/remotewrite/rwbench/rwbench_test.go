package rwbench

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpufleet/mig/k8s/gpumetrics/remotewrite"
	"github.com/gpufleet/mig/k8s/gpuscore"
)

// A small fleet through the whole measurement: every node and device sent is in the pushed snapshot, the pull
// form folds the same fleet, and the figures are filled.
func TestMeasureASmallFleet(t *testing.T) {
	figures, err := Measure(DefaultFleet(20), 2000, 15, 2, 15*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if figures.Series != 20*8*7*3 || figures.Requests != 2 || figures.ReceiveCPU <= 0 || figures.PullAnswerBytes == 0 {
		t.Errorf("figures %+v", figures)
	}
	t.Log(figures)
}

// The receiver's figures at the fleet sizes GPUFLEET_RW_FIGURES names (e.g. 1000,5000), averaged over
// GPUFLEET_RW_INTERVALS intervals (8), printed:
//
//	GPUFLEET_RW_FIGURES=1000,5000 go test ./gpumetrics/remotewrite/rwbench -run PrintReceiverFigures -v -timeout 30m
func TestPrintReceiverFigures(t *testing.T) {
	sizes := os.Getenv("GPUFLEET_RW_FIGURES")
	if sizes == "" {
		t.Skip("GPUFLEET_RW_FIGURES unset (e.g. 1000,5000)")
	}
	perSend, intervals := 2000, 8
	if v, err := strconv.Atoi(os.Getenv("GPUFLEET_RW_PER_SEND")); err == nil {
		perSend = v
	}
	if v, err := strconv.Atoi(os.Getenv("GPUFLEET_RW_INTERVALS")); err == nil && v > 0 {
		intervals = v
	}
	for _, size := range strings.Split(sizes, ",") {
		nodes, err := strconv.Atoi(strings.TrimSpace(size))
		if err != nil {
			t.Fatalf("GPUFLEET_RW_FIGURES: %q is no node count", size)
		}
		figures, err := Measure(DefaultFleet(nodes), perSend, 15, intervals, 15*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("max_samples_per_send %d, %s", perSend, figures)
	}
}

// The handler alone (snappy, decoding, the Store) over one interval of 1,000 nodes' requests, made once: ns per
// sample. The same timestamps again each round: the Store takes them (not older), so every sample is applied.
func BenchmarkReceiveSamples(b *testing.B) {
	fleet := DefaultFleet(1000)
	token := filepath.Join(b.TempDir(), "token")
	if err := os.WriteFile(token, []byte("bench-token"), 0o600); err != nil {
		b.Fatal(err)
	}
	store := remotewrite.NewStore([]string{"Hostname", "hostname"}, fleet.Job, fleet.Namespace, 5)
	receiver := remotewrite.NewReceiver(store, token)
	bodies := fleet.Requests(time.Now().UnixMilli(), 0, 2000)
	send := func() {
		for _, body := range bodies {
			request := httptest.NewRequest(http.MethodPost, remotewrite.Path, bytes.NewReader(body))
			request.Header.Set("Authorization", "Bearer bench-token")
			request.Header.Set("Content-Type", "application/x-protobuf")
			request.Header.Set("Content-Encoding", "snappy")
			recorder := httptest.NewRecorder()
			receiver.ServeHTTP(recorder, request)
			if recorder.Code != http.StatusNoContent {
				b.Fatalf("status %d", recorder.Code)
			}
		}
	}
	send() // the Store makes each series once; the benchmark is the steady state after
	for b.Loop() {
		send()
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(fleet.SeriesPerInterval()), "ns/sample")
}

// The receiver over the network at the real pace: gpufleet-rw-sender (another process) sends GPUFLEET_RW_NETWORK nodes'
// intervals to a receiver served here, read every second with Rank as the Refresher does; this process' CPU (the
// HTTP server included) over four intervals after a warm one, printed:
//
//	GPUFLEET_RW_NETWORK=5000 go test ./gpumetrics/remotewrite/rwbench -run PrintNetworkFigures -v -timeout 10m
func TestPrintNetworkFigures(t *testing.T) {
	nodes, err := strconv.Atoi(os.Getenv("GPUFLEET_RW_NETWORK"))
	if err != nil {
		t.Skip("GPUFLEET_RW_NETWORK unset (a node count, e.g. 5000)")
	}
	const interval = 15 * time.Second
	perSend := "2000"
	if v := os.Getenv("GPUFLEET_RW_PER_SEND"); v != "" {
		perSend = v
	}
	dir := t.TempDir()
	sender := filepath.Join(dir, "gpufleet-rw-sender")
	if out, err := exec.Command("go", "build", "-o", sender, "../../../cmd/gpufleet-rw-sender").CombinedOutput(); err != nil {
		t.Fatalf("building the sender: %v\n%s", err, out)
	}
	token := filepath.Join(dir, "token")
	if err := os.WriteFile(token, []byte("bench-token"), 0o600); err != nil {
		t.Fatal(err)
	}
	fleet := DefaultFleet(nodes)
	store := remotewrite.NewStore([]string{"Hostname", "hostname"}, fleet.Job, fleet.Namespace, 5)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	address, err := remotewrite.NewReceiver(store, token).Serve(ctx, "127.0.0.1:0", "", "")
	if err != nil {
		t.Fatal(err)
	}
	source := store.NewSource()
	args := gpuscore.DefaultArgs()
	policy := args.Policy()
	var nodesSeen atomic.Int64
	var longest atomic.Int64
	go func() { // the Refresher's reads
		ticker := time.NewTicker(time.Second)
		defer ticker.Stop()
		for version := uint64(1); ; version++ {
			select {
			case <-ctx.Done():
				return
			case <-ticker.C:
			}
			began := time.Now()
			if snapshot, _ := source.Fetch(ctx, version); snapshot != nil {
				snapshot.Rank(&policy)
				nodesSeen.Store(int64(len(snapshot.Nodes)))
			}
			if took := int64(time.Since(began)); took > longest.Load() {
				longest.Store(took)
			}
		}
	}()
	command := exec.CommandContext(ctx, sender, "-url", "http://"+address.String()+remotewrite.Path, "-token-file", token,
		"-nodes", strconv.Itoa(nodes), "-interval", interval.String(), "-intervals", "5", "-max-samples-per-send", perSend)
	output := &bytes.Buffer{}
	command.Stdout, command.Stderr = output, output
	start := time.Now()
	if err := command.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(start.Add(interval)))
	runtime.GC() // the warm interval made every series: its garbage is not the steady state's
	longest.Store(0)
	cpuBefore, wallBefore := cpuSeconds(), time.Now()
	if err := command.Wait(); err != nil {
		t.Fatalf("the sender: %v\n%s", err, output)
	}
	time.Sleep(time.Second) // the last read
	cpu, wall := cpuSeconds()-cpuBefore, time.Since(wallBefore)
	t.Logf("sender:\n%s", output)
	t.Logf("%d nodes over the network, max_samples_per_send %s: %.3f s CPU in %.1f s (four intervals and a read) = %.2f %% of one core; %d nodes in the last snapshot; longest read %v",
		nodes, perSend, cpu, wall.Seconds(), cpu/wall.Seconds()*100, nodesSeen.Load(), time.Duration(longest.Load()).Round(time.Millisecond))
	if nodesSeen.Load() != int64(nodes) {
		t.Errorf("%d nodes in the snapshot, %d sent", nodesSeen.Load(), nodes)
	}
}
