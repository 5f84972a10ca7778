package rwbench

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpufleet/mig/k8s/gpumetrics/remotewrite"
)

// A small fleet through the whole measurement: every node and device sent is in the pushed snapshot, the pull
// form folds the same fleet, and the figures are filled.
func TestMeasureASmallFleet(t *testing.T) {
	figures, err := Measure(DefaultFleet(20), 2000, 15, 15*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if figures.Series != 20*8*7*3 || figures.Requests != 2 || figures.ReceiveCPU <= 0 || figures.PullAnswerBytes == 0 {
		t.Errorf("figures %+v", figures)
	}
	t.Log(figures)
}

// The receiver's figures at the fleet sizes GPUFLEET_RW_FIGURES names (e.g. 1000,5000), printed:
//
//	GPUFLEET_RW_FIGURES=1000,5000 go test ./gpumetrics/remotewrite/rwbench -run PrintReceiverFigures -v -timeout 30m
func TestPrintReceiverFigures(t *testing.T) {
	sizes := os.Getenv("GPUFLEET_RW_FIGURES")
	if sizes == "" {
		t.Skip("GPUFLEET_RW_FIGURES unset (e.g. 1000,5000)")
	}
	perSend := 2000
	if v, err := strconv.Atoi(os.Getenv("GPUFLEET_RW_PER_SEND")); err == nil {
		perSend = v
	}
	for _, size := range strings.Split(sizes, ",") {
		nodes, err := strconv.Atoi(strings.TrimSpace(size))
		if err != nil {
			t.Fatalf("GPUFLEET_RW_FIGURES: %q is no node count", size)
		}
		figures, err := Measure(DefaultFleet(nodes), perSend, 15, 15*time.Second)
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
