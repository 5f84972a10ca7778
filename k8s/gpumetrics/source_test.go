package gpumetrics

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpufleet/mig/k8s/gpumetrics/metricstest"
	"github.com/gpufleet/mig/k8s/gpuscore"
)

func TestPrometheusSourceQueriesAndParses(t *testing.T) {
	var mu sync.Mutex
	queries := map[string]bool{}
	server := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		query := r.URL.Query().Get("query")
		mu.Lock()
		queries[query] = true
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		if strings.Contains(query, "timestamp(") {
			fmt.Fprint(w, `{"status":"success","data":{"resultType":"vector","result":[{"metric":{"hostname":"n1"},"value":[1,"1700000000.5"]}]}}`)
			return
		}
		fmt.Fprint(w, `{"status":"success","data":{"resultType":"vector","result":[
			{"metric":{"__name__":"DCGM_FI_PROF_GR_ENGINE_ACTIVE","hostname":"n1","gpu":"0","GPU_I_ID":"3","GPU_I_PROFILE":"2g.20gb"},"value":[1,"0.25"]},
			{"metric":{"__name__":"DCGM_FI_DEV_GPU_UTIL","Hostname":"n2","gpu":"1"},"value":[1,"40"]}]}}`)
	}))
	defer server.Close()
	source := newPrometheusSource(server.URL+"/", []string{"Hostname", "hostname"}, time.Second, 5, "")
	snapshot, err := source.Fetch(context.Background(), 7)
	if err != nil {
		t.Fatal(err)
	}
	if got := snapshot.Nodes["n1"]; got == nil || got.SampleTime != 1700000000.5 || got.Devices[metricstest.MIG][0] != (gpuscore.Device{Key: "0/3", Util: 0.25}) {
		t.Errorf("MIG node: %+v", got)
	}
	if got := snapshot.Nodes["n2"]; got == nil || got.Devices[gpuscore.WholeGPUResource][0].Util != 0.4 {
		t.Errorf("whole-GPU node: %+v", got)
	}
	series := `max by (__name__, Hostname, hostname, gpu, UUID, GPU_I_ID, GPU_I_PROFILE, pod, namespace, exported_pod, ` +
		`exported_namespace) ({__name__=~"DCGM_FI_DEV_GPU_UTIL|DCGM_FI_PROF_GR_ENGINE_ACTIVE|DCGM_FI_DEV_FB_USED|DCGM_FI_DEV_FB_FREE"})`
	times := "max by (Hostname, hostname) (timestamp(DCGM_FI_DEV_FB_FREE))"
	if len(queries) != 2 || !queries[series] || !queries[times] {
		t.Errorf("queries %v, want the extender's two", queries)
	}

	failing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprint(w, `{"status":"error","error":"parse error"}`)
	}))
	defer failing.Close()
	if _, err := newPrometheusSource(failing.URL, []string{"Hostname"}, time.Second, 5, "").Fetch(context.Background(), 1); err == nil ||
		!strings.Contains(err.Error(), "Prometheus query failed (HTTP 400): parse error") {
		t.Errorf("failing Prometheus: %v", err)
	}
}
