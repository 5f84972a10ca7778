package gpumetrics

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/gpufleet/mig/k8s/gpuscore"
)

// With prometheusQuery recorded the plugin asks when the rules were last evaluated, then for the recorded series,
// and decodes them; while the rules were not evaluated again it reads nothing more and keeps its snapshot.
func TestRecordedSourceAsksForTheRecordedSeriesOncePerEvaluation(t *testing.T) {
	var asked []string
	evaluated := "1700000000.5"
	packedSeries, nodeSampleTimeSeries := gpuscore.RecordedQueries()
	server := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		query := r.URL.Query().Get("query")
		asked = append(asked, query)
		w.Header().Set("Content-Type", "application/json")
		switch query {
		case gpuscore.RecordedEvaluationQuery:
			fmt.Fprintf(w, `{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1,"%s"]}]}}`, evaluated)
		case nodeSampleTimeSeries:
			fmt.Fprint(w, `{"status":"success","data":{"resultType":"vector","result":[{"metric":{"hostname":"n1"},"value":[1,"1700000000.5"]}]}}`)
		case packedSeries:
			fmt.Fprint(w, `{"status":"success","data":{"resultType":"vector","result":[
			{"metric":{"__name__":"gpufleet:dcgm_device:packed","hostname":"n1","gpu":"0","GPU_I_ID":"3","GPU_I_PROFILE":"2g.20gb"},"value":[1,"2500500002"]}]}}`)
		default:
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprint(w, `{"status":"error","error":"unexpected query"}`)
		}
	}))
	defer server.Close()
	source := newPrometheusSource(server.URL, []string{"Hostname", "hostname"}, time.Second, 5, "")
	source.useRecorded()
	snapshot, err := source.Fetch(context.Background(), 1)
	if err != nil {
		t.Fatal(err)
	}
	want := gpuscore.Device{Key: "0/3", Util: 0.25, Mem: 0.5, HasMem: true, Pods: 2, HasPods: true}
	if got := snapshot.Nodes["n1"]; got == nil || got.SampleTime != 1700000000.5 || got.Devices["nvidia.com/mig-2g.20gb"][0] != want {
		t.Errorf("node: %+v", got)
	}
	if len(asked) != 3 || asked[0] != gpuscore.RecordedEvaluationQuery {
		t.Errorf("queries %v: want the evaluation first, then the two recorded series", asked)
	}

	// Not evaluated since: one small query, no snapshot, no error.
	asked = nil
	if again, err := source.Fetch(context.Background(), 2); again != nil || err != nil {
		t.Errorf("unchanged evaluation: snapshot %v, error %v", again, err)
	}
	if len(asked) != 1 {
		t.Errorf("unchanged evaluation asked %v", asked)
	}
	// Evaluated again: read again.
	asked, evaluated = nil, "1700000010.5"
	if next, err := source.Fetch(context.Background(), 3); next == nil || err != nil || len(asked) != 3 {
		t.Errorf("new evaluation: snapshot %v, error %v, queries %v", next, err, asked)
	}
	// The refresher keeps its view (and what it memoized) while the source answers unchanged.
	fresh := newPrometheusSource(server.URL, []string{"Hostname", "hostname"}, time.Second, 5, "")
	fresh.useRecorded()
	args := gpuscore.DefaultArgs()
	refresher := NewRefresher(fresh, time.Second, args.Policy())
	if !refresher.RefreshOnce(context.Background()) || refresher.View().Snapshot.Nodes["n1"] == nil {
		t.Fatalf("first refresh: %+v", refresher.View().Snapshot)
	}
	view := refresher.View()
	if !refresher.RefreshOnce(context.Background()) || refresher.View() != view {
		t.Error("an unchanged evaluation replaced the view")
	}
}

// A Prometheus slower than prometheusTimeoutSeconds: the recorded refresh fails with the extender's words.
func TestRecordedSourceTimesOutWithTheExtendersMessage(t *testing.T) {
	release := make(chan struct{})
	server := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer server.Close()
	defer close(release)
	source := newPrometheusSource(server.URL, []string{"Hostname"}, 100*time.Millisecond, 5, "")
	source.useRecorded()
	snapshot, err := source.Fetch(context.Background(), 1)
	if snapshot != nil || err == nil || err.Error() != "Prometheus did not answer within prometheusTimeoutSeconds (0.1s)" {
		t.Errorf("snapshot %v, error %v", snapshot, err)
	}
}
